//! Failure scenarios 4 and 6 of `shared/scenarios.md` (short delays under load, long delays),
//! each a named regression test on a manual clock. CI runs them at a reduced size with the
//! same shape; `KAIROS_TEST_SCALE` raises it.
//!
//! Both run with the default horizon (18 days), resident window (1 minute) and payload window
//! (1 minute): at a checkpoint,
//! tasks due beyond the far span leave the wheel for an overflow file (24 bytes of memory each,
//! `Stats::far`), payloads of the others due later than the window go to disk too, and both
//! come back before delivery.

mod common;

use common::{drain, key, payload, scaled, SimHarness, SplitMix, Stop, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::{
    CancelOutcome, Config, Delivery, Due, Durability, Engine, ManualClock, NewTask, RecvError,
    ScheduleError,
};
use std::collections::BTreeSet;
use std::time::{Duration, Instant, UNIX_EPOCH};

const DAY_MS: u64 = 24 * 3600 * 1000;
const YEAR_MS: u64 = 365 * DAY_MS;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// As the other scenarios: the default lease (30 s) and retry policy; consumers ack at once.
fn config() -> Config {
    let mut c = common::config(Durability::Sync);
    c.lease = kairos::config::LEASE_DEFAULT;
    c
}

/// Moves the manual clock forward to `to_ms` (UTC ms) in one step.
fn clock_to(clock: &ManualClock, to_ms: u64) {
    let now = clock.wall_ms();
    assert!(to_ms >= now, "clock would go back from {now} to {to_ms}");
    clock.advance(ms(to_ms - now));
}

/// Checks that `ds` are exactly `expected` (key, due_ms, payload), in that order, all fired
/// now, first attempts; then acks them.
fn expect_fired(
    clock: &ManualClock,
    engine: &Engine,
    ds: &[Delivery],
    expected: &[(&[u8], u64, &[u8])],
) -> TestResult {
    let now = clock.wall_ms();
    let got: Vec<(&[u8], u64, &[u8])> = ds
        .iter()
        .map(|d| (d.key(), d.due_ms(), d.payload()))
        .collect();
    assert_eq!(got, expected, "at {now}");
    for d in ds {
        assert_eq!(d.fired_ms(), now, "{d:?}");
        assert_eq!(d.attempt(), 1, "{d:?}");
    }
    engine.ack_many(ds)?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------

/// One round of scenario 4 at the clock's current time t0: schedules +0, +10 ms and +1 s.
/// +0 is handed out at once (no clock movement); the others fire exactly at their deadline
/// (the tick is 1 ms), and nothing fires at deadline − 1 ms.
fn short_delays_round(clock: &ManualClock, engine: &Engine, round: usize) -> TestResult {
    let t0 = clock.wall_ms();
    let delays = [0u64, 10, 1_000];
    let keys: Vec<Vec<u8>> = delays
        .iter()
        .map(|d| format!("short-{round}-plus-{d}ms").into_bytes())
        .collect();
    let payloads: Vec<Vec<u8>> = delays
        .iter()
        .map(|d| payload(&format!("short+{d}"), round, 40))
        .collect();
    for i in 0..delays.len() {
        engine.schedule_after(&keys[i], ms(delays[i]), &payloads[i])?;
    }
    // +0: at once, the clock has not moved.
    let ds = drain(engine)?;
    expect_fired(clock, engine, &ds, &[(&keys[0], t0, &payloads[0])])?;
    for i in 1..delays.len() {
        let due = t0 + delays[i];
        clock_to(clock, due - 1);
        let early = drain(engine)?;
        assert!(
            early.is_empty(),
            "fired a tick early at {}: {early:?}",
            due - 1
        );
        clock_to(clock, due);
        let ds = drain(engine)?;
        expect_fired(clock, engine, &ds, &[(&keys[i], due, &payloads[i])])?;
    }
    Ok(())
}

/// Rounds of [`short_delays_round`], the clock moved 7 ms between them so rounds do not start
/// on a second boundary.
fn short_delays_rounds(clock: &ManualClock, engine: &Engine) -> TestResult {
    for round in 0..3 {
        short_delays_round(clock, engine, round)?;
        clock_to(clock, clock.wall_ms() + 7);
        assert!(drain(engine)?.is_empty());
    }
    Ok(())
}

/// Delay of far task `i` from the moment it is scheduled: 19 days ..= 1 year, a fixed
/// function of `i` (so a full-size run needs no model in memory).
fn far_delay_ms(i: usize) -> u64 {
    SplitMix(0x4f4 ^ (i as u64).wrapping_mul(0x9E37_79B9)).range(19 * DAY_MS, YEAR_MS)
}

fn far_key(i: usize) -> Vec<u8> {
    key("far-", i)
}

fn far_payload(i: usize) -> Vec<u8> {
    payload("far", i, 48)
}

/// Scenario 4 — short delays stay precise under load. With an idle engine, and again with
/// many far-future tasks pending (10 M at full size; due 19 days to 1 year ahead, payloads
/// moved to an overflow file by a checkpoint), tasks for +0, +10 ms and +1 s fire at their
/// deadline's tick on the manual clock, +0 at once, none a tick early. The far tasks are
/// untouched by it: at the end they all fire with their own due times and payloads.
/// (Real-clock lateness is measured by the benchmark, not asserted here.)
#[test]
fn scenario_04_short_delays_precise_under_load() -> TestResult {
    // On the real file system: at full size the log, the checkpoint and the overflow file
    // would not fit a simulated disk in memory. Segments of the default size, so a full-size
    // run does not make millions of files.
    let mut c = config();
    c.segment_bytes = kairos::config::SEGMENT_BYTES_DEFAULT;
    let clock = ManualClock::new(START_MS);

    // Idle engine.
    let dir = tempfile::tempdir()?;
    let engine = common::open_fs(dir.path(), c.clone(), &clock)?;
    short_delays_rounds(&clock, &engine)?;
    assert_eq!(engine.stats().pending, 0);
    engine.shutdown()?;
    drop(engine);

    // Loaded engine: far tasks scheduled in batches, their payloads moved to disk.
    let far = scaled(30_000, 10_000_000);
    let dir = tempfile::tempdir()?;
    let engine = common::open_fs(dir.path(), c, &clock)?;
    let t_load = clock.wall_ms();
    let started = Instant::now();
    const BATCH: usize = 10_000;
    for start in (0..far).step_by(BATCH) {
        let end = (start + BATCH).min(far);
        let keys: Vec<Vec<u8>> = (start..end).map(far_key).collect();
        let payloads: Vec<Vec<u8>> = (start..end).map(far_payload).collect();
        let batch: Vec<NewTask<'_>> = (start..end)
            .map(|i| NewTask {
                key: &keys[i - start],
                due: Due::After(ms(far_delay_ms(i))),
                payload: &payloads[i - start],
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    let scheduled = started.elapsed();
    let report = engine.checkpoint()?;
    assert!(report.written);
    assert_eq!(report.tasks, far as u64);
    assert_eq!(report.payloads_moved, far as u64);
    let stats = engine.stats();
    assert_eq!((stats.pending, stats.payloads_on_disk), (far, far));
    assert!(drain(&engine)?.is_empty());

    short_delays_rounds(&clock, &engine)?;
    let stats = engine.stats();
    assert_eq!((stats.pending, stats.payloads_on_disk), (far, far));

    // The far tasks were left alone: one year on, every one fires with its own due time and
    // payload, read back from disk.
    clock_to(&clock, t_load + YEAR_MS);
    let now = clock.wall_ms();
    let started = Instant::now();
    engine.run_until_idle();
    let consumer = engine.consumer();
    let mut seen = vec![false; far];
    let mut to_ack = Vec::with_capacity(BATCH);
    let mut got = 0usize;
    loop {
        let d = match consumer.try_recv() {
            Ok(d) => d,
            Err(RecvError::Empty) => break,
            Err(e) => return Err(e.into()),
        };
        let i: usize = std::str::from_utf8(d.key())
            .ok()
            .and_then(|k| k.strip_prefix("far-"))
            .and_then(|i| i.parse().ok())
            .filter(|&i| i < far)
            .ok_or_else(|| format!("unexpected delivery {d:?}"))?;
        assert!(!seen[i], "far task {i} fired twice");
        seen[i] = true;
        assert_eq!(d.due_ms(), t_load + far_delay_ms(i), "{d:?}");
        assert_eq!(d.payload(), &far_payload(i)[..], "{d:?}");
        assert_eq!((d.fired_ms(), d.attempt()), (now, 1), "{d:?}");
        got += 1;
        to_ack.push(d);
        if to_ack.len() == BATCH {
            engine.ack_many(&to_ack)?;
            to_ack.clear();
        }
    }
    engine.ack_many(&to_ack)?;
    assert_eq!(got, far, "far tasks delivered");
    let stats = engine.stats();
    assert_eq!((stats.pending, stats.payloads_on_disk), (0, 0));
    assert_eq!(stats.payloads_read_back, far as u64);
    eprintln!(
        "scenario 4: {far} far tasks: scheduled in {scheduled:?}, checkpoint {:?}, \
         delivered and acked with payloads read back in {:?}",
        report.elapsed,
        started.elapsed()
    );
    engine.shutdown()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------

/// One accepted task of scenario 6.
struct Long {
    key: Vec<u8>,
    payload: Vec<u8>,
    due_ms: u64,
    /// The tick its due time rounds up to: where a running engine fires it.
    tick_ms: u64,
    fired: bool,
}

/// Checks a refused schedule: `DueTooFar` with exactly these times, and nothing recorded.
fn expect_too_far(
    h: &SimHarness,
    result: Result<impl std::fmt::Debug, ScheduleError>,
    keys: &[&[u8]],
    due_ms: u64,
    max_ms: u64,
) -> TestResult {
    let pending = h.engine().stats().pending;
    match result {
        Err(ScheduleError::DueTooFar {
            due_ms: d,
            max_ms: m,
        }) if (d, m) == (due_ms, max_ms) => {}
        other => {
            let want = format!("DueTooFar {{ due_ms: {due_ms}, max_ms: {max_ms} }}");
            return Err(format!("{keys:?}: expected {want}, got {other:?}").into());
        }
    }
    for k in keys {
        assert_eq!(h.engine().cancel(k)?, CancelOutcome::NotFound, "{k:?}");
    }
    assert_eq!(h.engine().stats().pending, pending);
    Ok(())
}

/// Scenario 6 at one tick size.
fn long_delays(tick_ms: u64, seed: u64) -> TestResult {
    let mut c = config();
    c.tick = ms(tick_ms);
    let delay_max = c.delay_max;
    let window = c.payload_window.ok_or("no payload window")?;
    let delay_max_ms = delay_max.as_millis() as u64;
    let window_ms = window.as_millis() as u64;
    let mut h = SimHarness::new(seed, c)?;
    let t0 = h.clock.wall_ms();
    let round_up = |due: u64| due.div_ceil(tick_ms) * tick_ms;

    // Past delay_max: refused with the typed error, never clamped, never fired now.
    let too_far = t0 + delay_max_ms + 1;
    let max = t0 + delay_max_ms;
    let r = h
        .engine()
        .schedule_after(b"too-far-after", delay_max + ms(1), b"x");
    expect_too_far(&h, r, &[b"too-far-after"], too_far, max)?;
    let r = h
        .engine()
        .schedule_after(b"too-far-1ns", delay_max + Duration::from_nanos(1), b"x");
    expect_too_far(&h, r, &[b"too-far-1ns"], too_far, max)?;
    let r = h
        .engine()
        .schedule_at(b"too-far-at", ms_to_system_time(too_far), b"x");
    expect_too_far(&h, r, &[b"too-far-at"], too_far, max)?;
    let r = h
        .engine()
        .schedule_after(b"too-far-max", Duration::MAX, b"x");
    expect_too_far(&h, r, &[b"too-far-max"], u64::MAX, max)?;
    let r = h
        .engine()
        .schedule_at(b"too-far-at-max", ms_to_system_time(u64::MAX), b"x");
    expect_too_far(&h, r, &[b"too-far-at-max"], u64::MAX, max)?;
    // A batch with one task too far is refused whole.
    let r = h.engine().schedule_many(&[
        NewTask {
            key: b"batch-ok",
            due: Due::After(ms(1_000)),
            payload: b"ok",
        },
        NewTask {
            key: b"batch-too-far",
            due: Due::After(delay_max + ms(1)),
            payload: b"x",
        },
    ]);
    expect_too_far(&h, r, &[b"batch-ok", b"batch-too-far"], too_far, max)?;
    assert_eq!(h.engine().stats().pending, 0);

    // Accepted: the long delays, each ± 1 ms, the payload window ± 1 ms, a year, and
    // delay_max itself (as a delay and as an absolute time).
    let mut delays: Vec<(String, u64)> = Vec::new();
    for (name, base) in [
        ("2^31-1", (1u64 << 31) - 1),
        ("2^32", 1 << 32),
        ("2^36", 1 << 36),
        ("window", window_ms),
    ] {
        delays.push((format!("{name}-1ms"), base - 1));
        delays.push((name.to_string(), base));
        delays.push((format!("{name}+1ms"), base + 1));
    }
    delays.push(("1y".into(), YEAR_MS));
    delays.push(("delay_max".into(), delay_max_ms));
    let mut tasks: Vec<Long> = Vec::new();
    for (i, (name, delay)) in delays.iter().enumerate() {
        let k = format!("long-{name}").into_bytes();
        let p = payload(name, i, 64);
        h.engine().schedule_after(&k, ms(*delay), &p)?;
        tasks.push(Long {
            key: k,
            payload: p,
            due_ms: t0 + delay,
            tick_ms: round_up(t0 + delay),
            fired: false,
        });
    }
    let k = b"long-delay_max-at".to_vec();
    let p = b"due at now + delay_max".to_vec();
    h.engine()
        .schedule_at(&k, ms_to_system_time(t0 + delay_max_ms), &p)?;
    tasks.push(Long {
        key: k,
        payload: p,
        due_ms: t0 + delay_max_ms,
        tick_ms: round_up(t0 + delay_max_ms),
        fired: false,
    });

    // Due::At in the past (documented: fires at once, as overdue) — far past included.
    let past: [(&[u8], u64); 2] = [(b"past-epoch", 0), (b"past-1y", t0 - YEAR_MS)];
    for (k, at) in past {
        h.engine().schedule_at(k, UNIX_EPOCH + ms(at), k)?;
    }
    let ds = drain(h.engine())?;
    expect_fired(
        &h.clock,
        h.engine(),
        &ds,
        &[
            (past[0].0, past[0].1, past[0].0),
            (past[1].0, past[1].1, past[1].0),
        ],
    )?;
    assert_eq!(ds[0].lateness(), ms(t0));
    assert_eq!(ds[1].lateness(), ms(YEAR_MS));

    // Checkpoint: payloads due after now + window go to disk (the window ± 1 ms straddles
    // it). Then reopen from it, so the walk below reads them back from the overflow file.
    let on_disk = tasks.iter().filter(|t| t.due_ms > t0 + window_ms).count();
    assert_eq!(on_disk, tasks.len() - 2);
    let report = h.engine().checkpoint()?;
    assert_eq!(report.payloads_moved, on_disk as u64);
    assert_eq!(h.engine().stats().payloads_on_disk, on_disk);
    h.restart(Stop::ProcessCrash)?;
    assert_eq!(h.engine().recovery().pending, tasks.len());
    assert_eq!(h.engine().recovery().overdue, 0);
    assert_eq!(h.engine().stats().payloads_on_disk, on_disk);

    // Walk the clock in big steps: to 1 ms before each due time, to it, and to its tick.
    // Every few steps the engine is stopped (cleanly, by a crash, by a power cut) and the
    // clock moves while it is down; a checkpoint is taken now and then.
    let mut points: BTreeSet<u64> = BTreeSet::new();
    for t in &tasks {
        points.extend([t.due_ms - 1, t.due_ms, t.tick_ms]);
    }
    let stops = [
        None,
        Some(Stop::Clean),
        None,
        Some(Stop::ProcessCrash),
        None,
        Some(Stop::PowerCut),
    ];
    for (step, &p) in points.iter().enumerate() {
        match stops[step % stops.len()] {
            Some(how) => {
                h.stop(how)?;
                clock_to(&h.clock, p);
                h.start()?;
            }
            None => clock_to(&h.clock, p),
        }
        let ds = drain(h.engine())?;
        // Due by now and not yet fired, in (due time, scheduling order).
        let mut due: Vec<usize> = (0..tasks.len())
            .filter(|&i| !tasks[i].fired && tasks[i].due_ms <= p)
            .collect();
        due.sort_by_key(|&i| tasks[i].due_ms); // stable: scheduling order among equals
        let mut last_pos = None;
        for d in &ds {
            let i = tasks
                .iter()
                .position(|t| t.key == d.key())
                .ok_or_else(|| format!("unknown key fired: {d:?}"))?;
            let t = &mut tasks[i];
            assert!(!t.fired, "fired twice: {d:?}");
            assert_eq!(
                (d.due_ms(), d.payload()),
                (t.due_ms, &t.payload[..]),
                "{d:?}"
            );
            assert_eq!((d.fired_ms(), d.attempt()), (p, 1), "{d:?}");
            // Never early, at most a tick late.
            assert!(d.due_ms() <= p && p <= t.tick_ms, "{d:?} at {p}");
            assert_eq!(d.lateness(), ms(p - t.due_ms));
            t.fired = true;
            let pos = due.iter().position(|&j| j == i);
            assert!(pos > last_pos, "out of (due, scheduling) order: {d:?}");
            last_pos = pos;
        }
        // What is due and did not fire is not at its tick yet (a running engine fires a task
        // at its tick; one reopened after the due time fires it at once).
        for &i in &due {
            let t = &tasks[i];
            assert!(
                t.fired || t.tick_ms > p,
                "{} (due +{} ms) did not fire by +{} ms",
                String::from_utf8_lossy(&t.key),
                t.due_ms - t0,
                p - t0
            );
        }
        h.engine().ack_many(&ds)?;
        if step % 7 == 6 {
            h.engine().checkpoint()?;
        }
    }
    assert!(tasks.iter().all(|t| t.fired));
    assert_eq!(h.engine().stats().pending, 0);

    // Ten years on, the limit is relative to the new now: delay_max is still accepted, one
    // millisecond more still refused.
    let now = h.clock.wall_ms();
    let r = h
        .engine()
        .schedule_after(b"too-far-later", delay_max + ms(1), b"x");
    expect_too_far(
        &h,
        r,
        &[b"too-far-later"],
        now + delay_max_ms + 1,
        now + delay_max_ms,
    )?;
    h.engine()
        .schedule_after(b"delay_max-later", delay_max, b"y")?;
    assert!(drain(h.engine())?.is_empty());
    assert_eq!(
        h.engine().cancel(b"delay_max-later")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    h.stop(Stop::Clean)
}

/// Scenario 6 — no cliff at long delays. Delays of 2^31−1 ms, 2^32 ms and 2^36 ms (each ± 1),
/// the payload window (the "horizon") ± 1 ms, one year and `delay_max` each fire at their
/// deadline — not before, at most a tick after — with a 1 ms tick (exactly at the deadline)
/// and a 10 ms tick, across a checkpoint that moves their payloads to disk and reopens of
/// every kind. A due time past `delay_max` is refused with `ScheduleError::DueTooFar`, never
/// clamped nor fired now; `Due::At` in the past (even the epoch) fires at once as overdue.
#[test]
fn scenario_06_no_cliff_at_long_delays() -> TestResult {
    long_delays(1, 6)?;
    long_delays(10, 60)
}
