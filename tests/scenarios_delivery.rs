//! Failure scenarios 8, 9 and 10 of `shared/scenarios.md` (the delivery side: cancel racing
//! the deadline, wall-clock steps, a poison task), each a named regression test on a manual
//! clock. CI runs them at a reduced size with the same shape; `KAIROS_TEST_SCALE` raises it.

mod common;

use common::{config, drain, key, scaled, SimHarness, SplitMix, Stop, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::record::{Record, RECORD_CANCEL, RECORD_DELIVER, RECORD_SCHEDULE};
use kairos::{AckError, CancelOutcome, Delivery, Due, Durability, NackOutcome, NewTask, RecvError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Real time a test waits for other threads before it declares a hang (never reached in a
/// passing run; only bounds a failing one).
const HANG: Duration = Duration::from_secs(120);

/// Per task id, its log records in log order: (record type, fired_ms of a DELIVER).
fn log_by_task(h: &SimHarness) -> TestResult<BTreeMap<u64, Vec<(u8, u64)>>> {
    let mut out: BTreeMap<u64, Vec<(u8, u64)>> = BTreeMap::new();
    let mut bad = None;
    kairos_wal::scan(
        &h.sim,
        &h.wal_dir(),
        u32::MAX,
        &mut |view| match Record::decode(view.record_type, view.body) {
            Ok(r) => {
                let (id, fired) = match r {
                    Record::Schedule { id, .. }
                    | Record::Cancel { id }
                    | Record::Ack { id }
                    | Record::Retry { id, .. }
                    | Record::Dead { id, .. }
                    | Record::Purge { id }
                    | Record::Reschedule { id, .. }
                    | Record::Release { id } => (id, 0),
                    Record::Deliver { id, fired_ms } => (id, fired_ms),
                };
                out.entry(id.0).or_default().push((r.record_type(), fired));
            }
            Err(e) => bad = Some(e.to_string()),
        },
    )?;
    match bad {
        Some(e) => Err(format!("undecodable record: {e}").into()),
        None => Ok(out),
    }
}

// ---------------------------------------------------------------------------------------------

/// Scenario 8 — cancel racing the deadline. Many trials (100 k at full size), fifty sharing
/// each deadline; each is cancelled from one of four threads while the manual clock stands at
/// its deadline + an offset in −2..=+2 ms, as the driver hands out that millisecond's tasks and
/// two consumers receive (and hold) them. Every task ends either `Cancelled` and never
/// delivered, or `AlreadyDelivered` and delivered exactly once, on time; a cancel before the
/// deadline always wins. The log agrees: a `Cancelled` task's CANCEL follows at most a DELIVER
/// no consumer received, an `AlreadyDelivered` task's CANCEL follows its one DELIVER, and a
/// task cancelled before its deadline has no DELIVER at all. A power cut and reopen bring
/// nothing back.
#[test]
fn scenario_08_cancel_racing_the_deadline() -> TestResult {
    const PER_MS: usize = 50;
    const CANCELLERS: usize = 4;
    const CONSUMERS: usize = 2;
    let trials = scaled(20_000, 100_000);
    let mut h = SimHarness::new(8, config(Durability::Sync))?;
    let base = START_MS + 10;
    let due_of = |i: usize| base + (i / PER_MS) as u64;
    let mut rng = SplitMix(0x5ce8);
    let cancel_at: Vec<u64> = (0..trials)
        .map(|i| due_of(i) + rng.range(0, 4) - 2)
        .collect();
    let keys: Vec<Vec<u8>> = (0..trials).map(|i| key("s8-", i)).collect();
    let mut ids = Vec::with_capacity(trials);
    for (c, chunk) in keys.chunks(10_000).enumerate() {
        let batch: Vec<NewTask<'_>> = chunk
            .iter()
            .enumerate()
            .map(|(j, k)| NewTask {
                key: k,
                due: Due::At(ms_to_system_time(due_of(c * 10_000 + j))),
                payload: b"",
            })
            .collect();
        ids.extend(h.engine().schedule_many(&batch)?);
    }
    let last = cancel_at.iter().copied().max().ok_or("no trials")?;

    let now_ms = AtomicU64::new(h.clock.wall_ms());
    let progress: Vec<AtomicU64> = (0..CANCELLERS).map(|_| AtomicU64::new(0)).collect();
    let done = AtomicBool::new(false);
    let outcomes: Mutex<Vec<Option<CancelOutcome>>> = Mutex::new(vec![None; trials]);
    let received: Mutex<Vec<Delivery>> = Mutex::new(Vec::new());
    let engine = h.engine();
    let clock = &h.clock;
    std::thread::scope(|s| -> TestResult {
        let mut threads = Vec::new();
        for t in 0..CANCELLERS {
            let mut mine: Vec<(u64, usize)> = (t..trials)
                .step_by(CANCELLERS)
                .map(|i| (cancel_at[i], i))
                .collect();
            mine.sort_unstable();
            let (now_ms, progress, keys, outcomes) = (&now_ms, &progress[t], &keys, &outcomes);
            threads.push(s.spawn(move || -> TestResult {
                let mut next = 0;
                let mut local = Vec::with_capacity(mine.len());
                while next < mine.len() {
                    let now = now_ms.load(Ordering::Acquire);
                    while next < mine.len() && mine[next].0 <= now {
                        let i = mine[next].1;
                        local.push((i, engine.cancel(&keys[i])?));
                        next += 1;
                    }
                    progress.store(now, Ordering::Release);
                    std::thread::yield_now();
                }
                progress.store(u64::MAX, Ordering::Release);
                let mut all = outcomes.lock().map_err(|_| "poisoned")?;
                for (i, o) in local {
                    all[i] = Some(o);
                }
                Ok(())
            }));
        }
        for _ in 0..CONSUMERS {
            let (received, done) = (&received, &done);
            threads.push(s.spawn(move || -> TestResult {
                let consumer = engine.consumer();
                let mut local = Vec::new();
                loop {
                    match consumer.recv_timeout(ms(1)) {
                        // Held, not acked: a later cancel must say AlreadyDelivered.
                        Ok(d) => {
                            assert!(clock.wall_ms() >= d.due_ms(), "{d:?} early");
                            local.push(d);
                        }
                        Err(RecvError::Timeout) if done.load(Ordering::Acquire) => break,
                        Err(RecvError::Timeout) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                received.lock().map_err(|_| "poisoned")?.extend(local);
                Ok(())
            }));
        }
        // The clock: one millisecond at a time, each only after every canceller has issued
        // the cancels due at the current time; the cancels race the driver's hand-out.
        let give_up = Instant::now() + HANG;
        while clock.wall_ms() <= last {
            let now = clock.wall_ms();
            while progress.iter().any(|p| p.load(Ordering::Acquire) < now) {
                if Instant::now() > give_up {
                    return Err("cancellers hang".into());
                }
                std::thread::yield_now();
            }
            clock.advance(ms(1));
            now_ms.store(clock.wall_ms(), Ordering::Release);
            engine.run_until_idle();
        }
        engine.run_until_idle();
        done.store(true, Ordering::Release);
        for t in threads {
            t.join().map_err(|_| "thread panicked")??;
        }
        Ok(())
    })?;

    let outcomes = outcomes.into_inner().map_err(|_| "poisoned")?;
    let received = received.into_inner().map_err(|_| "poisoned")?;
    let mut times: BTreeMap<u64, usize> = BTreeMap::new();
    for d in &received {
        assert_eq!((d.attempt(), d.fired_ms()), (1, d.due_ms()), "{d:?}");
        *times.entry(d.task_id().0).or_default() += 1;
    }
    // Everything held was cancelled while held: the holder's ack is Ok and changes nothing.
    h.engine().ack_many(&received)?;
    assert_eq!(h.engine().stats().pending, 0);
    h.stop(Stop::Clean)?;
    let log = log_by_task(&h)?;
    let (mut early, mut won, mut lost) = (0, 0, 0);
    // At offset 0: (cancel before the hand-out, after it but before a consumer, after a consumer).
    let mut at_deadline = (0, 0, 0);
    for i in 0..trials {
        let id = ids[i].0;
        let n = times.get(&id).copied().unwrap_or(0);
        let records: Vec<u8> = log
            .get(&id)
            .map_or(Vec::new(), |r| r.iter().map(|x| x.0).collect());
        let delivered_at: Vec<u64> = log.get(&id).map_or(Vec::new(), |r| {
            r.iter()
                .filter(|x| x.0 == RECORD_DELIVER)
                .map(|x| x.1)
                .collect()
        });
        assert!(
            delivered_at.iter().all(|&t| t == due_of(i)),
            "trial {i}: {delivered_at:?}"
        );
        let offset = cancel_at[i] as i64 - due_of(i) as i64;
        match outcomes[i] {
            Some(CancelOutcome::Cancelled { deliveries: 0 }) => {
                assert_eq!(n, 0, "trial {i} (offset {offset}): cancelled and delivered");
                if offset < 0 {
                    assert_eq!(records, [RECORD_SCHEDULE, RECORD_CANCEL], "trial {i}");
                    early += 1;
                } else if offset == 0 {
                    // Raced the driver's hand-out of this very millisecond.
                    if records == [RECORD_SCHEDULE, RECORD_CANCEL] {
                        at_deadline.0 += 1;
                    } else {
                        assert_eq!(
                            records,
                            [RECORD_SCHEDULE, RECORD_DELIVER, RECORD_CANCEL],
                            "trial {i}"
                        );
                        at_deadline.1 += 1;
                    }
                    won += 1;
                } else {
                    // Handed out before the cancel, taken back before any consumer got it.
                    assert_eq!(
                        records,
                        [RECORD_SCHEDULE, RECORD_DELIVER, RECORD_CANCEL],
                        "trial {i}"
                    );
                    won += 1;
                }
            }
            Some(CancelOutcome::AlreadyDelivered { attempt: 1 }) => {
                assert!(
                    offset >= 0,
                    "trial {i}: delivered before its cancel at {offset} ms"
                );
                if offset == 0 {
                    at_deadline.2 += 1;
                }
                assert_eq!(n, 1, "trial {i}: AlreadyDelivered, received {n} times");
                assert_eq!(
                    records,
                    [RECORD_SCHEDULE, RECORD_DELIVER, RECORD_CANCEL],
                    "trial {i}"
                );
                lost += 1;
            }
            other => return Err(format!("trial {i} (offset {offset}): {other:?}").into()),
        }
    }
    assert_eq!(times.len(), lost, "a task received twice or unknown");
    eprintln!(
        "scenario 8: {trials} trials: {early} cancelled before the deadline, {won} won at or \
         after it, {lost} lost to a consumer; at the deadline itself (before the hand-out, \
         before a consumer, after a consumer): {at_deadline:?}"
    );
    h.start()?;
    h.restart(Stop::PowerCut)?;
    assert_eq!(h.engine().recovery().pending, 0);
    assert!(h.advance(ms(3_600_000))?.is_empty());
    h.stop(Stop::Clean)
}

// ---------------------------------------------------------------------------------------------

/// One step of scenario 9's timeline, at a monotonic offset from the start.
#[derive(Debug, Clone, Copy)]
enum ClockEvent {
    StepWall(i64),
    Suspend(u64),
    /// Schedules an absolute (`Due::At`) and a relative (`Due::After`) task `delay_ms` ahead.
    Schedule(u64),
}

/// Scenario 9 — wall-clock steps. Tasks are pending (relative and absolute ones, due every
/// second for two minutes) while the wall clock is stepped −1 h, +1 h and −24 h and the
/// monotonic clock jumps 20 s (a suspend). Each task is handed out at its monotonic deadline to
/// the millisecond — no mass firing on a forward step, no stall on a backward one — except
/// that those falling due inside the suspend come out at once when it ends; tasks scheduled
/// after a step (absolute ones with the stepped wall clock) fire as far ahead as asked; no
/// task fires twice. Then the reopen rule: a due time still pending at an open is mapped with
/// the wall clock read at that open, so after a +1 h step while closed the tasks due within
/// that hour come out at once, oldest first, and after a −1 h step they wait an hour longer.
#[test]
fn scenario_09_wall_clock_steps() -> TestResult {
    let mut h = SimHarness::new(9, config(Durability::Sync))?;
    let e = h.engine();
    // key → expected monotonic offset (ms) of its hand-out.
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for i in 1..=120u64 {
        e.schedule_after(format!("rel-{i}").as_bytes(), ms(i * 1_000), b"")?;
        e.schedule_at(
            format!("abs-{i}").as_bytes(),
            ms_to_system_time(START_MS + i * 1_000 + 500),
            b"",
        )?;
        expected.insert(format!("rel-{i}"), i * 1_000);
        expected.insert(format!("abs-{i}"), i * 1_000 + 500);
    }
    let events = [
        (10_000u64, ClockEvent::StepWall(-3_600_000)),
        (20_000, ClockEvent::Schedule(5_000)),
        (30_250, ClockEvent::StepWall(3_600_000)),
        (40_000, ClockEvent::Schedule(7_001)),
        (50_750, ClockEvent::StepWall(-86_400_000)),
        (55_000, ClockEvent::Schedule(5_000)),
        (70_100, ClockEvent::Suspend(20_000)),
        (100_000, ClockEvent::StepWall(86_400_000)),
    ];
    // Due inside the suspend (70.1 s, 90.1 s]: out at its end.
    for v in expected.values_mut() {
        if (70_101..=90_100).contains(v) {
            *v = 90_100;
        }
    }
    let mut mono = 0u64; // monotonic offset of the clock now
    let mut fired: BTreeMap<String, u64> = BTreeMap::new();
    let check = |h: &SimHarness, fired: &mut BTreeMap<String, u64>, mono: u64| -> TestResult {
        let ds = drain(h.engine())?;
        for d in &ds {
            let k = String::from_utf8_lossy(d.key()).into_owned();
            assert_eq!(d.attempt(), 1, "{k}");
            assert_eq!(d.fired_ms(), h.clock.wall_ms(), "{k}");
            if fired.insert(k.clone(), mono).is_some() {
                return Err(format!("{k} fired twice").into());
            }
        }
        h.engine().ack_many(&ds)?;
        Ok(())
    };
    let mut events = events.iter().peekable();
    loop {
        // The next moment anything should happen: a task falls due or an event.
        let next_task = expected
            .iter()
            .filter(|(k, _)| !fired.contains_key(*k))
            .map(|(_, &t)| t)
            .min();
        let next_event = events.peek().map(|(t, _)| *t);
        let Some(next) = [next_task, next_event].into_iter().flatten().min() else {
            break;
        };
        // Nothing before it (no mass firing after a forward step)…
        if next > mono + 1 {
            h.clock.advance(ms(next - 1 - mono));
            mono = next - 1;
            check(&h, &mut fired, mono)?;
        }
        // …and exactly what is due at it (no stall after a backward step).
        h.clock.advance(ms(next - mono));
        mono = next;
        check(&h, &mut fired, mono)?;
        while let Some((_, event)) = events.next_if(|(t, _)| *t == mono) {
            match *event {
                ClockEvent::StepWall(d) => h.clock.step_wall(d),
                ClockEvent::Suspend(d) => {
                    h.clock.advance_monotonic(ms(d));
                    mono += d;
                }
                ClockEvent::Schedule(delay) => {
                    let wall = h.clock.wall_ms();
                    let (a, r) = (format!("late-abs-{mono}"), format!("late-rel-{mono}"));
                    h.engine()
                        .schedule_at(a.as_bytes(), ms_to_system_time(wall + delay), b"")?;
                    h.engine().schedule_after(r.as_bytes(), ms(delay), b"")?;
                    expected.insert(a, mono + delay);
                    expected.insert(r, mono + delay);
                }
            }
            check(&h, &mut fired, mono)?;
        }
    }
    for (k, t) in &fired {
        assert_eq!(expected.get(k), Some(t), "{k} fired at +{t} ms");
    }
    assert_eq!(fired.len(), expected.len());
    assert_eq!(h.engine().stats().pending, 0);

    // The reopen rule.
    let wall = h.clock.wall_ms();
    for (k, delay) in [
        ("soon", 10_000u64),
        ("later", 20_000),
        ("next-day", 7_200_000),
    ] {
        h.engine()
            .schedule_at(k.as_bytes(), ms_to_system_time(wall + delay), b"")?;
    }
    h.stop(Stop::Clean)?;
    h.clock.step_wall(3_600_000);
    h.start()?;
    assert_eq!(h.engine().recovery().overdue, 2);
    let ds = drain(h.engine())?;
    assert_eq!(
        ds.iter()
            .map(|d| (d.key(), d.lateness()))
            .collect::<Vec<_>>(),
        [
            (&b"soon"[..], ms(3_600_000 - 10_000)),
            (&b"later"[..], ms(3_600_000 - 20_000))
        ]
    );
    h.engine().ack_many(&ds)?;
    assert!(h.advance(ms(3_600_000 - 1))?.is_empty());
    let d = h.advance(ms(1))?;
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].key(), b"next-day");
    h.engine().ack_many(&d)?;

    let wall = h.clock.wall_ms();
    h.engine()
        .schedule_at(b"after-back-step", ms_to_system_time(wall + 10_000), b"")?;
    h.stop(Stop::Clean)?;
    h.clock.step_wall(-3_600_000);
    h.start()?;
    assert!(h.advance(ms(3_610_000 - 1))?.is_empty());
    let d = h.advance(ms(1))?;
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].key(), d[0].due_ms(), d[0].fired_ms()),
        (&b"after-back-step"[..], wall + 10_000, wall + 10_000)
    );
    h.stop(Stop::Clean)
}

// ---------------------------------------------------------------------------------------------

/// Scenario 10 — poison task. A consumer always fails task X; the retry policy is 3 attempts
/// with backoff 1 s, 2 s (then 4 s, never reached: the third failure is the last); the engine
/// is reopened between attempts, after a clean shutdown, a process crash and a power cut.
/// Exactly 3 attempts are made, at +1 s, +2 s and +4 s (the count survives the restarts), then
/// X is dead-lettered with its last error and stays so across another reopen; the other
/// tasks, due every 250 ms throughout, each fire once, on time.
#[test]
fn scenario_10_poison_task() -> TestResult {
    let mut c = config(Durability::Sync);
    c.lease = Duration::from_secs(30);
    c.retry.max_attempts = 3;
    c.retry.backoff_initial = Duration::from_secs(1);
    c.retry.backoff_multiplier = 2;
    c.retry.backoff_jitter_percent = 0;
    let mut h = SimHarness::new(10, c)?;
    let x = h.engine().schedule_after(b"X", ms(1_000), b"poison")?;
    let others = 40u64;
    for i in 1..=others {
        h.engine()
            .schedule_after(format!("ok-{i}").as_bytes(), ms(i * 250), b"fine")?;
    }
    // Restart between attempts: after +1.5 s, +3 s and +5 s.
    let restarts = [
        (1_500u64, Stop::Clean),
        (3_000, Stop::ProcessCrash),
        (5_000, Stop::PowerCut),
    ];
    let mut attempts: Vec<(u32, u64)> = Vec::new();
    let mut ok_fired: BTreeMap<String, u64> = BTreeMap::new();
    let mut t = 0u64;
    while t < 12_000 {
        h.clock.advance(ms(250));
        t += 250;
        for d in drain(h.engine())? {
            if d.key() == b"X" {
                assert_eq!(d.task_id(), x);
                attempts.push((d.attempt(), t));
                let outcome =
                    h.engine()
                        .nack(&d, None, &format!("X failed on attempt {}", d.attempt()))?;
                let expected = match d.attempt() {
                    1 => NackOutcome::Retry {
                        next_attempt: 2,
                        due: ms_to_system_time(START_MS + 2_000),
                    },
                    2 => NackOutcome::Retry {
                        next_attempt: 3,
                        due: ms_to_system_time(START_MS + 4_000),
                    },
                    _ => NackOutcome::DeadLettered,
                };
                assert_eq!(outcome, expected);
            } else {
                let k = String::from_utf8_lossy(d.key()).into_owned();
                assert_eq!(d.due_ms(), START_MS + t, "{k}");
                assert!(ok_fired.insert(k, t).is_none(), "fired twice");
                h.engine().ack(&d)?;
            }
        }
        if let Some(&(_, how)) = restarts.iter().find(|(at, _)| *at == t) {
            h.restart(how)?;
        }
    }
    assert_eq!(attempts, [(1, 1_000), (2, 2_000), (3, 4_000)]);
    assert_eq!(ok_fired.len(), others as usize);
    let dead = h.engine().dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (
            dead[0].task_id,
            &dead[0].key[..],
            &dead[0].payload[..],
            dead[0].attempts
        ),
        (x, &b"X"[..], &b"poison"[..], 3)
    );
    assert_eq!(dead[0].error, "X failed on attempt 3");
    assert_eq!(
        (dead[0].due_ms, dead[0].dead_ms),
        (START_MS + 4_000, START_MS + 4_000)
    );
    h.restart(Stop::PowerCut)?;
    assert_eq!(h.engine().dead_letters(), dead);
    assert_eq!(h.engine().recovery().pending, 0);
    assert!(h.advance(ms(3_600_000))?.is_empty());
    assert_eq!(h.engine().cancel(b"X")?, CancelOutcome::NotFound);
    h.stop(Stop::Clean)
}

/// Scenario 10 where the failing "consumer" is the process itself: it crashes while holding X,
/// three times. Each restart counts the interrupted attempt; the third leaves X dead-lettered
/// at open with the lost lease as its error, and its last delivery is refused afterwards.
#[test]
fn scenario_10_poison_task_crashing_its_consumer() -> TestResult {
    let mut c = config(Durability::Sync);
    c.retry.max_attempts = 3;
    c.retry.backoff_jitter_percent = 0;
    let mut h = SimHarness::new(11, c)?;
    let x = h.engine().schedule_after(b"X", ms(1_000), b"poison")?;
    h.engine().schedule_after(b"bystander", ms(5_000), b"")?;
    let mut d = h.advance(ms(1_000))?;
    for attempt in 1..=3u32 {
        assert_eq!(
            d.iter()
                .map(|d| (d.task_id(), d.attempt()))
                .collect::<Vec<_>>(),
            [(x, attempt)]
        );
        h.restart(if attempt == 2 {
            Stop::PowerCut
        } else {
            Stop::ProcessCrash
        })?;
        let r = h.engine().recovery();
        assert_eq!(
            (r.redelivered, r.dead_lettered),
            if attempt < 3 { (1, 0) } else { (0, 1) }
        );
        let stale = d.pop().ok_or("no delivery")?;
        assert_matches_not_outstanding(h.engine().ack(&stale))?;
        d = drain(h.engine())?;
    }
    assert!(d.is_empty());
    let dead = h.engine().dead_letters();
    assert_eq!(
        dead.iter()
            .map(|d| (d.task_id, d.attempts))
            .collect::<Vec<_>>(),
        [(x, 3)]
    );
    assert_eq!(
        dead[0].error,
        "in flight when the engine stopped (lease lost in a restart)"
    );
    let b = h.advance(ms(4_000))?;
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].key(), b"bystander");
    h.stop(Stop::Clean)
}

fn assert_matches_not_outstanding(r: Result<(), AckError>) -> TestResult {
    match r {
        Err(AckError::NotOutstanding { .. }) => Ok(()),
        other => Err(format!("expected NotOutstanding, got {other:?}").into()),
    }
}
