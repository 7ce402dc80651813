//! Bad input gets a typed error, never a panic, and never costs a task already scheduled.
//!
//! Every test starts from an engine holding a few "keeper" tasks, makes bad calls, checks the
//! exact error, and finally checks every keeper still fires with its payload and due time.

mod common;

use common::{by_key, config, key, payload, SimHarness, Stop, TestResult, START_MS};
use kairos::config::BATCH_TASKS_MAX;
use kairos::{
    AckError, CancelError, CancelOutcome, Config, Due, Durability, Engine, ManualClock, NewTask,
    OpenError, RecvError, ScheduleError,
};
use kairos_wal::{Storage, WalError};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

const KEEPERS: usize = 5;
/// Keepers are due 2–6 s from the start.
const KEEPER_DELAY_MS: u64 = 2_000;

type Tasks = common::TaskMap;

fn schedule_keepers(engine: &Engine, now_ms: u64) -> TestResult<Tasks> {
    let mut keepers = Tasks::new();
    for i in 0..KEEPERS {
        let delay = KEEPER_DELAY_MS + 1_000 * i as u64;
        let (k, p) = (key("keeper-", i), payload("keep", i, 10));
        engine.schedule_after(&k, Duration::from_millis(delay), &p)?;
        keepers.insert(k, (now_ms + delay, p));
    }
    Ok(keepers)
}

/// A harness with tight limits and the keepers scheduled.
fn harness(tweak: impl FnOnce(&mut Config)) -> TestResult<(SimHarness, Tasks)> {
    let mut c = config(Durability::Sync);
    c.key_bytes_max = 16;
    c.payload_bytes_max = 64;
    c.delay_max = Duration::from_secs(3_600);
    tweak(&mut c);
    let h = SimHarness::new(42, c)?;
    let keepers = schedule_keepers(h.engine(), START_MS)?;
    Ok((h, keepers))
}

/// Restarts (crash, then clean) and checks exactly `expected` fires once the clock has passed
/// `until_ms`, nothing early.
fn assert_survivors(h: &mut SimHarness, expected: &Tasks, until_ms: u64) -> TestResult {
    h.restart(Stop::PowerCut)?;
    assert_eq!(h.engine().recovery().pending, expected.len());
    let mut got = Vec::new();
    while h.clock.wall_ms() < until_ms {
        let ds = h.advance(Duration::from_millis(500))?;
        let now = h.clock.wall_ms();
        assert!(ds.iter().all(|d| d.due_ms() <= now), "early: {ds:?}");
        got.extend(ds);
    }
    assert_eq!(&by_key(&got)?, expected);
    h.stop(Stop::Clean)
}

fn keepers_end() -> u64 {
    START_MS + KEEPER_DELAY_MS + 1_000 * KEEPERS as u64
}

#[test]
fn bad_keys_and_payloads_are_rejected() -> TestResult {
    let (mut h, mut keepers) = harness(|_| {})?;
    let e = h.engine();
    let at = Duration::from_secs(1);
    assert!(matches!(
        e.schedule_after(b"", at, b"p"),
        Err(ScheduleError::EmptyKey)
    ));
    assert!(matches!(
        e.schedule_after(&[b'k'; 17], at, b"p"),
        Err(ScheduleError::KeyTooLong { bytes: 17, max: 16 })
    ));
    assert!(matches!(
        e.schedule_after(b"k", at, &[0; 65]),
        Err(ScheduleError::PayloadTooLarge { bytes: 65, max: 64 })
    ));
    // A bad task anywhere makes the whole batch fail.
    let batch = [
        NewTask {
            key: b"fine",
            due: Due::After(at),
            payload: b"",
        },
        NewTask {
            key: &[b'k'; 17],
            due: Due::After(at),
            payload: b"",
        },
    ];
    assert!(matches!(
        e.schedule_many(&batch),
        Err(ScheduleError::KeyTooLong { .. })
    ));
    assert_eq!(e.cancel(b"fine")?, CancelOutcome::NotFound);
    // The limits themselves are accepted.
    e.schedule_after(&[b'k'; 16], at, &[7; 64])?;
    e.schedule_after(b"empty-payload", at, b"")?;
    keepers.insert(vec![b'k'; 16], (START_MS + 1_000, vec![7; 64]));
    keepers.insert(b"empty-payload".to_vec(), (START_MS + 1_000, vec![]));
    assert_survivors(&mut h, &keepers, keepers_end())
}

#[test]
fn due_past_delay_max_is_rejected_never_clamped_never_fired() -> TestResult {
    let (mut h, mut keepers) = harness(|_| {})?;
    let e = h.engine();
    let max_ms = START_MS + 3_600_000;
    // Exactly delay_max is fine.
    e.schedule_after(b"at-max", Duration::from_secs(3_600), b"m")?;
    keepers.insert(b"at-max".to_vec(), (max_ms, b"m".to_vec()));
    let too_far = [
        Due::After(Duration::from_millis(3_600_001)),
        Due::At(UNIX_EPOCH + Duration::from_millis(max_ms + 1)),
        Due::After(Duration::from_secs(100 * 365 * 86_400)),
        Due::After(Duration::MAX),
    ];
    for (i, due) in too_far.into_iter().enumerate() {
        let k = key("far-", i);
        match e.schedule(&k, due, b"never") {
            Err(ScheduleError::DueTooFar {
                due_ms,
                max_ms: got_max,
            }) => {
                assert_eq!(got_max, max_ms, "{due:?}");
                assert!(due_ms > max_ms, "{due:?}: due_ms {due_ms}");
            }
            other => return Err(format!("{due:?}: expected DueTooFar, got {other:?}").into()),
        }
        assert_eq!(e.cancel(&k)?, CancelOutcome::NotFound);
    }
    // A sub-millisecond excess rounds up and is refused too.
    assert!(matches!(
        e.schedule_after(
            b"far-ns",
            Duration::from_millis(3_600_000) + Duration::from_nanos(1),
            b""
        ),
        Err(ScheduleError::DueTooFar { .. })
    ));
    // Run well past every due time, across a restart: only the accepted tasks ever fire.
    assert_survivors(&mut h, &keepers, max_ms + 7_200_000)
}

/// Exactly `delay_max` is accepted also when the wall clock is not on a whole millisecond (as
/// a real clock almost never is), and the limit is kept in whole milliseconds as due times
/// are: a due time, rounded up to the millisecond, is accepted exactly when it is at most
/// now + `delay_max` rounded up — the `max_ms` a refusal at that reading reports. So
/// `schedule_after(key, delay_max, ..)`, and `Due::At` of the same instant, are accepted (they
/// were refused with a `max_ms` one below their `due_ms`), a nanosecond more still falls in
/// that millisecond, and a due time in the next one is refused; every accepted due time is at
/// most that `max_ms` (a review's test).
#[test]
fn exactly_delay_max_is_accepted_between_milliseconds() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let mut c = Config::default();
    c.delay_max = Duration::from_secs(3_600);
    let e = Engine::in_memory(c, Arc::new(clock.clone()))?;
    // The wall clock at START_MS + 0.5 ms: the latest due time is START_MS + 3 600 000.5 ms,
    // in whole milliseconds START_MS + 3 600 001.
    clock.advance(Duration::from_micros(500));
    let max = Duration::from_secs(3_600);
    let latest_ms = START_MS + 3_600_001;
    let id = e.schedule_after(b"after-max", max, b"")?;
    let due = e.lookup(b"after-max")?.ok_or("scheduled task not found")?;
    assert_eq!((due.id, due.due_ms), (id, latest_ms));
    let at = UNIX_EPOCH + Duration::from_micros(START_MS * 1_000 + 500) + max;
    e.schedule_at(b"at-max", at, b"")?;
    e.schedule_after(b"a-ns-more", max + Duration::from_nanos(1), b"")?;
    e.schedule_after(b"half-ms-more", max + Duration::from_micros(500), b"")?;
    let mut accepted = Vec::new();
    for k in [&b"after-max"[..], b"at-max", b"a-ns-more", b"half-ms-more"] {
        accepted.push(e.lookup(k)?.ok_or("scheduled task not found")?.due_ms);
    }
    assert_eq!(accepted, [latest_ms; 4]);
    let past = max + Duration::from_micros(500) + Duration::from_nanos(1);
    match e.schedule_after(b"past-max", past, b"") {
        Err(ScheduleError::DueTooFar { due_ms, max_ms }) => {
            assert_eq!((due_ms, max_ms), (latest_ms + 1, latest_ms));
        }
        other => return Err(format!("expected DueTooFar, got {other:?}").into()),
    }
    Ok(())
}

#[test]
fn due_before_epoch_is_rejected_and_a_past_due_time_fires_at_once() -> TestResult {
    let (mut h, keepers) = harness(|_| {})?;
    let e = h.engine();
    let before = UNIX_EPOCH - Duration::from_millis(1);
    assert!(matches!(
        e.schedule_at(b"before", before, b""),
        Err(ScheduleError::DueBeforeEpoch)
    ));
    // At the epoch itself: long past, so overdue now — delivered at once, not rejected.
    e.schedule_at(b"epoch", UNIX_EPOCH, b"old")?;
    let ds = common::drain(e)?;
    assert_eq!(
        common::triples(&ds),
        vec![("epoch".to_string(), b"old".to_vec(), 0)]
    );
    assert_eq!(ds[0].lateness(), Duration::from_millis(START_MS));
    e.ack(&ds[0])?;
    assert_survivors(&mut h, &keepers, keepers_end())
}

#[test]
fn too_many_pending_is_rejected_until_a_task_leaves() -> TestResult {
    let (mut h, mut keepers) = harness(|c| c.pending_tasks_max = KEEPERS + 2)?;
    let e = h.engine();
    let at = Duration::from_secs(60);
    e.schedule_after(b"a", at, b"a")?;
    let batch = [
        NewTask {
            key: b"b",
            due: Due::After(at),
            payload: b"b",
        },
        NewTask {
            key: b"c",
            due: Due::After(at),
            payload: b"c",
        },
    ];
    let max = KEEPERS + 2;
    match e.schedule_many(&batch) {
        Err(ScheduleError::TooManyPending { pending, max: m }) => {
            assert_eq!((pending, m), (max - 1, max))
        }
        other => return Err(format!("expected TooManyPending, got {other:?}").into()),
    }
    assert_eq!(
        e.cancel(b"b")?,
        CancelOutcome::NotFound,
        "a refused batch scheduled nothing"
    );
    e.schedule_after(b"b", at, b"b")?;
    assert!(matches!(
        e.schedule_after(b"c", at, b"c"),
        Err(ScheduleError::TooManyPending { .. })
    ));
    // A cancel frees a place.
    assert_eq!(e.cancel(b"a")?, CancelOutcome::Cancelled { deliveries: 0 });
    e.schedule_after(b"c", at, b"c")?;
    // A delivered but unacked task still counts; its ack frees the place.
    let d = h.advance(Duration::from_millis(KEEPER_DELAY_MS))?;
    assert_eq!(d.len(), 1);
    let e = h.engine();
    assert!(matches!(
        e.schedule_after(b"d", at, b"d"),
        Err(ScheduleError::TooManyPending { .. })
    ));
    e.ack(&d[0])?;
    keepers.remove(d[0].key());
    e.schedule_after(b"d", at, b"d")?;
    // The limit holds after a restart too.
    h.restart(Stop::PowerCut)?;
    assert!(matches!(
        h.engine().schedule_after(b"e", at, b"e"),
        Err(ScheduleError::TooManyPending { .. })
    ));
    for k in ["b", "c"] {
        keepers.insert(
            k.as_bytes().to_vec(),
            (START_MS + 60_000, k.as_bytes().to_vec()),
        );
    }
    let d_due = START_MS + KEEPER_DELAY_MS + 60_000;
    keepers.insert(b"d".to_vec(), (d_due, b"d".to_vec()));
    assert_survivors(&mut h, &keepers, d_due + 1_000)
}

#[test]
fn existing_key_and_duplicate_key_in_batch_are_rejected_whole() -> TestResult {
    let (mut h, keepers) = harness(|_| {})?;
    let e = h.engine();
    let k0 = key("keeper-", 0);
    match e.schedule_after(&k0, Duration::from_secs(1), b"other") {
        Err(ScheduleError::AlreadyExists { key }) => assert_eq!(key, "keeper-0"),
        other => return Err(format!("expected AlreadyExists, got {other:?}").into()),
    }
    let at = Due::After(Duration::from_secs(1));
    let dup = [
        NewTask {
            key: b"x",
            due: at,
            payload: b"",
        },
        NewTask {
            key: b"y",
            due: at,
            payload: b"",
        },
        NewTask {
            key: b"x",
            due: at,
            payload: b"",
        },
    ];
    match e.schedule_many(&dup) {
        Err(ScheduleError::DuplicateKeyInBatch { key }) => assert_eq!(key, "x"),
        other => return Err(format!("expected DuplicateKeyInBatch, got {other:?}").into()),
    }
    let clash = [
        NewTask {
            key: b"x",
            due: at,
            payload: b"",
        },
        NewTask {
            key: &k0,
            due: at,
            payload: b"",
        },
    ];
    assert!(matches!(
        e.schedule_many(&clash),
        Err(ScheduleError::AlreadyExists { .. })
    ));
    for k in [&b"x"[..], b"y"] {
        assert_eq!(
            e.cancel(k)?,
            CancelOutcome::NotFound,
            "a refused batch scheduled nothing"
        );
    }
    assert!(matches!(e.schedule_many(&[]), Ok(ids) if ids.is_empty()));
    assert_survivors(&mut h, &keepers, keepers_end())
}

#[test]
fn batch_over_the_limit_is_rejected() -> TestResult {
    let (mut h, keepers) = harness(|_| {})?;
    let one = NewTask {
        key: b"same",
        due: Due::After(Duration::from_secs(1)),
        payload: b"",
    };
    let batch = vec![one; BATCH_TASKS_MAX + 1];
    match h.engine().schedule_many(&batch) {
        Err(ScheduleError::BatchTooLarge { tasks, max }) => {
            assert_eq!((tasks, max), (BATCH_TASKS_MAX + 1, BATCH_TASKS_MAX))
        }
        other => {
            return Err(format!("expected BatchTooLarge, got {:?}", other.map(|v| v.len())).into())
        }
    }
    drop(batch);
    assert_survivors(&mut h, &keepers, keepers_end())
}

#[test]
fn calls_after_shutdown_fail_closed() -> TestResult {
    let (mut h, keepers) = harness(|_| {})?;
    let ds = h.advance(Duration::from_millis(KEEPER_DELAY_MS))?;
    assert_eq!(ds.len(), 1);
    let consumer = h.engine().consumer();
    h.engine().shutdown()?;
    let e = h.engine();
    assert!(matches!(
        e.schedule_after(b"late", Duration::from_secs(1), b""),
        Err(ScheduleError::Closed)
    ));
    assert!(matches!(e.cancel(b"keeper-1"), Err(CancelError::Closed)));
    assert!(matches!(e.ack(&ds[0]), Err(AckError::Closed)));
    // Empty batches answer as every call does (schedule_many and ack_many said Ok).
    assert!(matches!(e.schedule_many(&[]), Err(ScheduleError::Closed)));
    assert!(matches!(e.cancel_many(&[]), Err(CancelError::Closed)));
    assert!(matches!(e.ack_many(&[]), Err(AckError::Closed)));
    assert!(matches!(consumer.ack_many(&[]), Err(AckError::Closed)));
    assert_eq!(consumer.try_recv().unwrap_err(), RecvError::Closed);
    assert_eq!(consumer.recv().unwrap_err(), RecvError::Closed);
    e.shutdown()?; // idempotent
    drop(consumer);
    // The unacked delivery comes again after reopen; everything else is intact.
    h.restart(Stop::Clean)?;
    let again = common::drain(h.engine())?;
    assert_eq!(common::triples(&again), common::triples(&ds));
    assert_eq!(again[0].attempt(), 2);
    h.engine().ack(&again[0])?;
    let mut rest = keepers;
    rest.remove(again[0].key());
    assert_survivors(&mut h, &rest, keepers_end())
}

#[test]
fn second_open_of_a_directory_is_locked_fs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let open = || common::open_fs(dir.path(), config(Durability::Sync), &clock);
    let first = open()?;
    let keepers = schedule_keepers(&first, START_MS)?;
    match open() {
        Err(OpenError::Locked { path }) => assert_eq!(path, dir.path()),
        other => return Err(format!("expected Locked, got {:?}", other.map(|_| ())).into()),
    }
    // The same through the default constructor (real clock).
    assert!(matches!(
        Engine::open(dir.path(), config(Durability::Sync)),
        Err(OpenError::Locked { .. })
    ));
    // The first engine is unaffected, and the lock goes with it.
    first.schedule_after(b"after", Duration::from_secs(1), b"a")?;
    first.shutdown()?;
    drop(first);
    let second = open()?;
    assert_eq!(second.recovery().pending, keepers.len() + 1);
    second.shutdown()?;
    Ok(())
}

/// A data directory path that names a regular file: the error says it is not a directory
/// (it said "File exists"), and the file is left as it was.
#[test]
fn a_file_in_place_of_the_data_directory_is_named_as_such() -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("orders");
    std::fs::write(&file, b"not a directory")?;
    match Engine::open(&file, config(Durability::Sync)) {
        Err(e @ OpenError::Io { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "create directory {}: it exists and is not a directory",
                file.display()
            )
        ),
        other => return Err(format!("expected Io, got {:?}", other.map(|_| ())).into()),
    }
    assert_eq!(std::fs::read(&file)?, b"not a directory");
    Ok(())
}

#[test]
fn second_open_of_a_directory_is_locked_sim() -> TestResult {
    let (mut h, keepers) = harness(|_| {})?;
    match h.open() {
        Err(OpenError::Locked { path }) => assert_eq!(path, h.dir),
        other => return Err(format!("expected Locked, got {:?}", other.map(|_| ())).into()),
    }
    h.engine()
        .schedule_after(b"after", Duration::from_secs(1), b"a")?;
    let mut keepers = keepers;
    keepers.insert(b"after".to_vec(), (START_MS + 1_000, b"a".to_vec()));
    assert_survivors(&mut h, &keepers, keepers_end())
}

#[test]
fn segment_from_another_directory_is_refused_as_foreign() -> TestResult {
    // Two logs with the same start of history, so the same segment names, but different store
    // ids; theirs goes on to more segments than ours.
    let (mut ours, keepers) = harness(|_| {})?;
    let mut theirs = SimHarness::new(43, ours.config.clone())?;
    schedule_keepers(theirs.engine(), START_MS)?;
    for i in 0..200 {
        theirs
            .engine()
            .schedule_after(&key("more-", i), Duration::from_secs(9), &[b'm'; 60])?;
    }
    ours.stop(Stop::Clean)?;
    theirs.stop(Stop::Clean)?;
    let our_segments = ours.segments()?;
    let their_segments = theirs.segments()?;
    assert!(
        their_segments.len() > our_segments.len() + 1,
        "{their_segments:?}"
    );
    assert_eq!(our_segments[0].file_name(), their_segments[0].file_name());

    // Our first segment replaced by theirs.
    let victim = &our_segments[0];
    let original = ours.sim.read_file(victim).ok_or("no segment")?;
    let foreign = theirs
        .sim
        .read_file(&their_segments[0])
        .ok_or("no segment")?;
    ours.sim.write_file(victim, &foreign);
    match ours.open() {
        Err(OpenError::Wal(WalError::ForeignSegment { file })) => {
            assert_eq!(file.file_name(), victim.file_name())
        }
        other => {
            return Err(format!("expected ForeignSegment, got {:?}", other.map(|_| ())).into())
        }
    }
    assert_eq!(
        ours.sim.read_file(victim).as_deref(),
        Some(&foreign[..]),
        "refused file changed"
    );
    ours.sim.write_file(victim, &original);

    // One of theirs added after our last segment.
    let extra = their_segments
        .iter()
        .find(|s| !our_segments.iter().any(|o| o.file_name() == s.file_name()))
        .ok_or("theirs has no segment name ours lacks")?;
    let extra_path = ours.wal_dir().join(extra.file_name().ok_or("no name")?);
    let extra_bytes = theirs.sim.read_file(extra).ok_or("no segment")?;
    ours.sim.write_file(&extra_path, &extra_bytes);
    match ours.open() {
        Err(OpenError::Wal(WalError::ForeignSegment { file })) => {
            assert_eq!(file.file_name(), extra_path.file_name())
        }
        Err(OpenError::Wal(WalError::MissingSegment { .. })) => {}
        other => {
            return Err(format!(
                "foreign segment after ours: expected ForeignSegment, got {:?}",
                other.map(|_| ())
            )
            .into())
        }
    }
    assert_eq!(
        ours.sim.read_file(&extra_path),
        Some(extra_bytes),
        "refused file changed"
    );
    // Removed for good: the check below ends with a power cut, which undoes unsynced removals.
    ours.sim.remove_file(&extra_path)?;
    ours.sim.sync_dir(&ours.wal_dir())?;

    // With our own files back, nothing was lost.
    ours.start()?;
    assert_survivors(&mut ours, &keepers, keepers_end())
}

#[test]
fn invalid_config_is_rejected() -> TestResult {
    let clock = Arc::new(ManualClock::new(START_MS));
    type Tweak = fn(&mut Config);
    let cases: [(&str, Tweak); 6] = [
        ("tick 0", |c| c.tick = Duration::ZERO),
        ("tick 1.5 ms", |c| c.tick = Duration::from_micros(1_500)),
        ("key_bytes_max 0", |c| c.key_bytes_max = 0),
        ("pending_tasks_max 0", |c| c.pending_tasks_max = 0),
        ("segment_bytes 1 KiB", |c| c.segment_bytes = 1024),
        ("delay_max 1000 years", |c| {
            c.delay_max = Duration::from_secs(1_000 * 365 * 86_400)
        }),
    ];
    for (name, tweak) in cases {
        let mut c = Config::default();
        tweak(&mut c);
        assert!(
            matches!(
                Engine::in_memory(c.clone(), clock.clone()),
                Err(OpenError::InvalidConfig { .. })
            ),
            "{name}"
        );
        let dir = tempfile::tempdir()?;
        assert!(
            matches!(
                Engine::open(dir.path(), c),
                Err(OpenError::InvalidConfig { .. })
            ),
            "{name}"
        );
        assert_eq!(
            std::fs::read_dir(dir.path())?.count(),
            0,
            "{name}: files created"
        );
    }
    Ok(())
}

#[test]
fn cancel_of_unknown_keys_and_stale_acks_are_answered_not_errors() -> TestResult {
    let (mut h, keepers) = harness(|_| {})?;
    let e = h.engine();
    assert_eq!(e.cancel(b"")?, CancelOutcome::NotFound);
    assert_eq!(e.cancel(&[b'z'; 10_000])?, CancelOutcome::NotFound);
    assert_eq!(
        e.cancel_many(&[b"keeper-0", b"nope", b"keeper-0"])?,
        vec![
            CancelOutcome::Cancelled { deliveries: 0 },
            CancelOutcome::NotFound,
            CancelOutcome::NotFound
        ]
    );
    let mut keepers = keepers;
    keepers.remove(&key("keeper-", 0));
    let ds = h.advance(Duration::from_millis(KEEPER_DELAY_MS + 1_000))?;
    assert_eq!(ds.len(), 1);
    let e = h.engine();
    e.ack(&ds[0])?;
    assert!(
        matches!(e.ack(&ds[0]), Err(AckError::NotOutstanding { task_id }) if task_id == ds[0].task_id().0)
    );
    keepers.remove(ds[0].key());
    assert_survivors(&mut h, &keepers, keepers_end())
}

/// A full disk (ENOSPC) or an I/O error on write or fdatasync poisons the engine with a typed
/// error: every later call says `Poisoned`, consumers see `Poisoned`, shutdown reports it. A
/// reopen recovers everything acknowledged before.
#[test]
fn io_failure_poisons_with_typed_errors_and_reopen_recovers() -> TestResult {
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let faults = [
        (FaultOp::Write, FaultKind::Enospc),
        (FaultOp::Write, FaultKind::ShortWrite),
        (FaultOp::Sync, FaultKind::Eio),
    ];
    for (op, kind) in faults {
        let (mut h, keepers) = harness(|_| {})?;
        let consumer = h.engine().consumer();
        h.sim.inject(FaultPlan { after: 0, op, kind });
        match h
            .engine()
            .schedule_after(b"doomed", Duration::from_secs(1), b"d")
        {
            Err(e @ ScheduleError::Poisoned { .. }) => {
                // The message says what to do about it, not only what happened.
                let said = e.to_string();
                assert!(
                    said.starts_with("the engine is poisoned: ")
                        && said.ends_with(
                            "(a poisoned engine takes no more changes: shut it down, deal \
                             with the cause, and open the directory again)"
                        ),
                    "{said}"
                );
            }
            other => return Err(format!("{kind:?}: expected Poisoned, got {other:?}").into()),
        }
        let e = h.engine();
        assert!(matches!(
            e.schedule_after(b"later", Duration::from_secs(1), b""),
            Err(ScheduleError::Poisoned { .. })
        ));
        assert!(matches!(
            e.cancel(b"keeper-0"),
            Err(CancelError::Poisoned { .. })
        ));
        assert!(matches!(consumer.recv(), Err(RecvError::Poisoned { .. })));
        assert!(e.shutdown().is_err(), "{kind:?}: shutdown hid the failure");
        drop(consumer);
        // Reopen after a crash: the keepers are there; the failed schedule may or may not be
        // (its record may have reached the disk), but it is whole if it is.
        h.restart(Stop::ProcessCrash)?;
        let pending = h.engine().recovery().pending;
        let mut expected = keepers.clone();
        if pending == KEEPERS + 1 {
            expected.insert(b"doomed".to_vec(), (START_MS + 1_000, b"d".to_vec()));
        } else {
            assert_eq!(pending, KEEPERS, "{kind:?}");
        }
        assert_eq!(h.engine().cancel(b"later")?, CancelOutcome::NotFound);
        assert_survivors(&mut h, &expected, keepers_end())?;
    }
    Ok(())
}

/// A batch whose records together exceed the log's largest frame (1 GiB) is bad input like
/// any other: a typed error, nothing scheduled, and the engine keeps working. (65 tasks with
/// the largest payload; the payload bytes are shared, but the engine encodes ~1.1 GB.)
#[test]
fn batch_larger_than_a_log_frame_is_rejected_without_poisoning() -> TestResult {
    use kairos::config::PAYLOAD_BYTES_MAX_LIMIT;
    let (mut h, mut keepers) = harness(|c| c.payload_bytes_max = PAYLOAD_BYTES_MAX_LIMIT)?;
    let big = vec![0x5a; PAYLOAD_BYTES_MAX_LIMIT];
    let keys: Vec<Vec<u8>> = (0..65).map(|i| key("big-", i)).collect();
    let batch: Vec<NewTask<'_>> = keys
        .iter()
        .map(|k| NewTask {
            key: k,
            due: Due::After(Duration::from_secs(1)),
            payload: &big,
        })
        .collect();
    let got = h.engine().schedule_many(&batch).map(|ids| ids.len());
    drop(batch);
    assert!(
        !matches!(got, Ok(_) | Err(ScheduleError::Poisoned { .. })),
        "oversized batch: expected a typed input error, got {got:?}"
    );
    assert_eq!(h.engine().cancel(&keys[0])?, CancelOutcome::NotFound);
    // The engine still works, and one task of the largest size is fine.
    h.engine()
        .schedule_after(b"big-one", Duration::from_secs(1), &big)?;
    keepers.insert(b"big-one".to_vec(), (START_MS + 1_000, big));
    assert_survivors(&mut h, &keepers, keepers_end())
}

/// A delivery is acked only by the engine instance that made it: another engine (here a second
/// in-memory engine, or the same directory reopened) answers `NotOutstanding` and its own task
/// stays outstanding.
#[test]
fn ack_of_a_delivery_from_another_engine_is_refused() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let a = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    let b = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    a.schedule_after(b"engine-a-task", Duration::from_millis(5), b"")?;
    b.schedule_after(b"engine-b-task", Duration::from_millis(5), b"")?;
    let da = common::advance(&clock, &a, Duration::from_millis(5))?;
    let db = common::drain(&b)?;
    assert_eq!((da.len(), db.len()), (1, 1));
    assert!(matches!(
        b.ack(&da[0]),
        Err(AckError::NotOutstanding { task_id: 1 })
    ));
    assert_eq!(b.stats().in_flight, 1);
    b.ack(&db[0])?;
    a.ack(&da[0])?;
    assert_eq!((a.stats().in_flight, b.stats().in_flight), (0, 0));
    Ok(())
}

/// A `SystemTime` too far ahead to count in `u64` milliseconds is `DueTooFar`, not
/// `DueBeforeEpoch`.
#[test]
fn far_future_system_time_is_due_too_far() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(Config::default(), Arc::new(clock))?;
    let far = UNIX_EPOCH + Duration::from_secs(i64::MAX as u64 / 2);
    match engine.schedule_at(b"far", far, b"") {
        Err(ScheduleError::DueTooFar { due_ms, max_ms }) => {
            assert_eq!(due_ms, u64::MAX);
            assert_eq!(
                max_ms,
                START_MS + Config::default().delay_max.as_millis() as u64
            );
        }
        other => return Err(format!("expected DueTooFar, got {other:?}").into()),
    }
    Ok(())
}

/// A tick outside 1 ms..=1 h is a configuration error, not an engine that never fires.
#[test]
fn absurd_ticks_are_invalid_config() -> TestResult {
    for tick in [Duration::from_secs(3601), Duration::from_secs(u64::MAX)] {
        let mut c = Config::default();
        c.tick = tick;
        let got = Engine::in_memory(c, Arc::new(ManualClock::new(START_MS)));
        assert!(
            matches!(got, Err(OpenError::InvalidConfig { .. })),
            "tick {tick:?}: {got:?}"
        );
    }
    Ok(())
}

/// `Durability::Interval(0)` is a configuration error found before the directory is touched:
/// nothing is created (the log refused it only after `open` had made the directory and its
/// lock file).
#[test]
fn a_zero_interval_is_invalid_config_and_touches_nothing() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let mut c = Config::default();
    c.durability = kairos::Durability::Interval(Duration::ZERO);
    match Engine::open(&dir, c) {
        Err(OpenError::InvalidConfig { reason }) => {
            assert!(reason.contains("Interval"), "{reason}");
        }
        other => return Err(format!("expected InvalidConfig, got {other:?}").into()),
    }
    assert!(
        !dir.exists(),
        "a refused configuration created {}",
        dir.display()
    );
    Ok(())
}

/// An empty data directory path (an unset variable, most likely) is refused: without the
/// check the engine's files landed in the working directory.
#[test]
fn an_empty_directory_path_is_refused() -> TestResult {
    match Engine::open("", Config::default()) {
        Err(OpenError::Io { source, .. }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::InvalidInput);
            assert!(source.to_string().contains("empty"), "{source}");
        }
        other => return Err(format!("expected Io(InvalidInput), got {other:?}").into()),
    }
    Ok(())
}

/// Moving far tasks out of the wheel after every zero tasks is a configuration error.
#[test]
fn relocating_far_tasks_after_zero_of_them_is_invalid_config() -> TestResult {
    let mut c = Config::default();
    c.relocate_far_tasks = Some(0);
    let got = Engine::in_memory(c, Arc::new(ManualClock::new(START_MS)));
    match got {
        Err(OpenError::InvalidConfig { reason }) => {
            assert!(reason.contains("relocate_far_tasks"), "{reason}");
        }
        other => return Err(format!("expected InvalidConfig, got {other:?}").into()),
    }
    Ok(())
}

/// `cancel_many` and `ack_many` beyond `BATCH_TASKS_MAX` are refused whole, without poisoning.
#[test]
fn cancel_and_ack_batches_over_the_limit_are_refused() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    engine.schedule_after(b"k", Duration::from_millis(1), b"")?;
    let keys: Vec<&[u8]> = vec![b"k"; BATCH_TASKS_MAX + 1];
    assert!(matches!(
        engine.cancel_many(&keys),
        Err(CancelError::BatchTooLarge { .. })
    ));
    let d = common::advance(&clock, &engine, Duration::from_millis(1))?;
    let many = vec![d[0].clone(); BATCH_TASKS_MAX + 1];
    assert!(matches!(
        engine.ack_many(&many),
        Err(AckError::BatchTooLarge { .. })
    ));
    engine.ack(&d[0])?;
    Ok(())
}

/// `relocate_far_bytes` of zero is refused at open, naming the setting.
#[test]
fn relocating_far_tasks_after_zero_bytes_is_invalid_config() -> TestResult {
    let mut c = Config::default();
    c.relocate_far_bytes = 0;
    match Engine::in_memory(c, Arc::new(ManualClock::new(START_MS))) {
        Err(OpenError::InvalidConfig { reason }) => {
            assert!(reason.contains("relocate_far_bytes"), "{reason}");
        }
        other => return Err(format!("expected InvalidConfig, got {other:?}").into()),
    }
    Ok(())
}
