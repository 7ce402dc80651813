//! Failure scenarios from the field (`shared/scenarios.md`), each a named regression test.
//! CI runs them at a reduced size with the same shape; `KAIROS_TEST_SCALE` raises the sizes.

mod common;

use common::{
    advance, by_key, drain, key, payload, scaled, SimHarness, SplitMix, Stop, TestResult, START_MS,
};
use kairos::{CancelOutcome, Config, Delivery, Due, Durability, Engine, ManualClock, NewTask};
use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
use std::collections::BTreeMap;
use std::time::Duration;

/// The scenarios run with leases and retries as an application has them: the default lease
/// (30 s) and retry policy. Consumers ack what they receive at once.
fn config(durability: Durability) -> Config {
    let mut c = common::config(durability);
    c.lease = kairos::config::LEASE_DEFAULT;
    c
}

/// One schedule call of scenario 1 (a single task or a batch).
struct Call {
    /// Global scheduling order of its tasks (`seq..seq + keys.len()`).
    seq: usize,
    keys: Vec<Vec<u8>>,
    /// Did the call return `Ok`?
    returned: bool,
}

/// Scenario 1 — crash with a torn tail. Tasks with 1–60 s delays are scheduled in rounds;
/// each round ends with an injected I/O fault at a random operation (a short write tears a
/// frame mid-record, an EIO may hit a write, a sync or a segment roll) or simply stops, and
/// then a process crash or a power cut. Every reopen must succeed without repair. At the end
/// the clock runs past 60 s: every schedule that returned fires exactly once at its due time
/// with its payload, a failed call fires entirely or not at all, nothing else fires.
#[test]
fn scenario_01_torn_tail_reopen() -> TestResult {
    let total = scaled(2_000, 100_000);
    let mut rng = SplitMix(0x5ce1);
    let mut h = SimHarness::new(1, config(Durability::Sync))?;
    // Task index → (due_ms, payload).
    let mut tasks: BTreeMap<usize, (u64, Vec<u8>)> = BTreeMap::new();
    let mut calls: Vec<Call> = Vec::new();
    let mut next = 0usize;
    let mut rounds = 0;
    let mut torn_reported = 0;
    while next < total {
        rounds += 1;
        let quota = rng.range(50, 600) as usize;
        if rng.chance(75) {
            let kind = [FaultKind::ShortWrite, FaultKind::Eio, FaultKind::Enospc]
                [rng.range(0, 2) as usize];
            let op = [FaultOp::Any, FaultOp::Write, FaultOp::Sync][rng.range(0, 2) as usize];
            h.sim.inject(FaultPlan {
                after: rng.range(0, 3 * quota as u64),
                op,
                kind,
            });
        }
        let round_end = (next + quota).min(total);
        while next < round_end {
            let n = if rng.chance(20) {
                rng.range(2, 5) as usize
            } else {
                1
            };
            let n = n.min(round_end - next);
            let keys: Vec<Vec<u8>> = (next..next + n).map(|i| key("task-", i)).collect();
            let payloads: Vec<Vec<u8>> = (next..next + n).map(|i| payload("s1", i, 120)).collect();
            let delays: Vec<u64> = (0..n).map(|_| rng.range(1_000, 60_000)).collect();
            let batch: Vec<NewTask<'_>> = (0..n)
                .map(|j| NewTask {
                    key: &keys[j],
                    due: Due::After(Duration::from_millis(delays[j])),
                    payload: &payloads[j],
                })
                .collect();
            let returned = h.engine().schedule_many(&batch).is_ok();
            for j in 0..n {
                tasks.insert(next + j, (START_MS + delays[j], payloads[j].clone()));
            }
            calls.push(Call {
                seq: next,
                keys,
                returned,
            });
            next += n;
            if !returned {
                break; // poisoned: the process "dies" here
            }
        }
        let how = if rng.chance(50) {
            Stop::ProcessCrash
        } else {
            Stop::PowerCut
        };
        h.restart(how)
            .map_err(|e| format!("round {rounds}: reopen after {how:?} failed: {e}"))?;
        torn_reported += usize::from(h.engine().recovery().wal.torn_tail.is_some());
    }
    assert!(rounds >= 3, "only {rounds} rounds");

    // Run the clock past every due time, one second at a time.
    let mut delivered: Vec<(Delivery, u64)> = Vec::new();
    for _ in 0..61 {
        let ds = h.advance(Duration::from_secs(1))?;
        h.engine().ack_many(&ds)?;
        let now = h.clock.wall_ms();
        delivered.extend(ds.into_iter().map(|d| (d, now)));
    }
    let index_of = |k: &[u8]| -> Option<usize> {
        std::str::from_utf8(k)
            .ok()?
            .strip_prefix("task-")?
            .parse()
            .ok()
    };
    let mut seen: BTreeMap<usize, u64> = BTreeMap::new();
    let mut order: Vec<(u64, usize)> = Vec::new();
    for (d, now) in &delivered {
        let i = index_of(d.key()).ok_or_else(|| format!("unknown key fired: {d:?}"))?;
        let (due_ms, p) = tasks
            .get(&i)
            .ok_or_else(|| format!("never scheduled: {d:?}"))?;
        assert_eq!(
            (d.due_ms(), d.payload()),
            (*due_ms, &p[..]),
            "half-written task fired"
        );
        assert!(
            d.due_ms() <= *now && *now - d.due_ms() < 1_000,
            "{d:?} at {now}"
        );
        assert_eq!(d.attempt(), 1);
        if seen.insert(i, *now).is_some() {
            return Err(format!("task {i} fired twice").into());
        }
        order.push((d.due_ms(), i));
    }
    let mut sorted = order.clone();
    sorted.sort();
    assert!(
        order == sorted,
        "deliveries not in (due time, scheduling order)"
    );
    let mut lost_unknown = 0;
    for c in &calls {
        let fired = (c.seq..c.seq + c.keys.len())
            .filter(|i| seen.contains_key(i))
            .count();
        if c.returned {
            assert_eq!(
                fired,
                c.keys.len(),
                "returned schedule of {:?} lost",
                c.keys
            );
        } else {
            assert!(
                fired == 0 || fired == c.keys.len(),
                "batch half applied: {:?}",
                c.keys
            );
            lost_unknown += usize::from(fired == 0);
        }
    }
    eprintln!(
        "scenario 1: {total} tasks, {rounds} crashes, {torn_reported} torn tails reported, \
         {lost_unknown} failed calls lost, {} delivered",
        seen.len()
    );
    h.stop(Stop::Clean)
}

/// Scenario 2 — closed while a task is due: schedule +30 s, close at +10 s, reopen at +60 s.
/// Delivered once, at once, with its 30 s lateness visible; no re-arm call needed.
#[test]
fn scenario_02_closed_while_due() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let open = || common::open_fs(dir.path(), config(Durability::Sync), &clock);
    let engine = open()?;
    engine.schedule_after(
        b"order:1:timeout",
        Duration::from_secs(30),
        b"cancel order 1",
    )?;
    assert!(advance(&clock, &engine, Duration::from_secs(10))?.is_empty());
    engine.shutdown()?;
    drop(engine);

    clock.advance(Duration::from_secs(50));
    let engine = open()?;
    assert_eq!(engine.recovery().pending, 1);
    assert_eq!(engine.recovery().overdue, 1);
    let ds = drain(&engine)?; // no clock movement: promptly
    assert_eq!(ds.len(), 1, "{ds:?}");
    let d = &ds[0];
    assert_eq!(
        (d.key(), d.payload()),
        (&b"order:1:timeout"[..], &b"cancel order 1"[..])
    );
    assert_eq!(d.due_ms(), START_MS + 30_000);
    assert_eq!(d.fired_ms(), START_MS + 60_000);
    assert_eq!(d.lateness(), Duration::from_secs(30));
    assert_eq!(d.attempt(), 1);
    engine.ack(d)?;
    assert!(
        advance(&clock, &engine, Duration::from_secs(3_600))?.is_empty(),
        "delivered twice"
    );
    engine.shutdown()?;
    drop(engine);
    let engine = open()?;
    assert_eq!(engine.recovery().pending, 0);
    assert!(drain(&engine)?.is_empty());
    engine.shutdown()?;
    Ok(())
}

/// Scenario 3 — same deadline, no early firing. Tick 10 ms; N tasks with one deadline T,
/// scheduled 20 ms apart as the clock moves toward T, with every fourth step also a task at
/// T + 5 ms. None comes out before its due time, equal deadlines come out in scheduling
/// order, lateness is at most one tick.
#[test]
fn scenario_03_same_deadline_no_early() -> TestResult {
    const TICK_MS: u64 = 10;
    let n = scaled(1_000, 10_000);
    let mut c = config(Durability::Sync);
    c.tick = Duration::from_millis(TICK_MS);
    let h = SimHarness::new(3, c)?;
    let deadline = START_MS + 20 * (n as u64 + 1);
    let mut at_t = Vec::new();
    let mut at_t5 = Vec::new();
    for i in 0..n {
        let k = key("t-", i);
        h.engine()
            .schedule_at(&k, common_time(deadline), &payload("t", i, 8))?;
        at_t.push(k);
        if i % 4 == 0 {
            let k = key("t5-", i);
            h.engine()
                .schedule_at(&k, common_time(deadline + 5), &payload("t5", i, 8))?;
            at_t5.push(k);
        }
        let early = h.advance(Duration::from_millis(20))?;
        assert!(
            early.is_empty(),
            "fired early at {}: {early:?}",
            h.clock.wall_ms()
        );
    }
    // Now 20 ms before T: walk millisecond by millisecond past T + 5 ms + a tick.
    assert_eq!(h.clock.wall_ms(), deadline - 20);
    let mut out: Vec<(Delivery, u64)> = Vec::new();
    for _ in 0..40 {
        let ds = h.advance(Duration::from_millis(1))?;
        let now = h.clock.wall_ms();
        out.extend(ds.into_iter().map(|d| (d, now)));
    }
    for (d, now) in &out {
        assert!(
            d.due_ms() <= *now,
            "{d:?} received at {now}, before its due time"
        );
        assert!(
            d.lateness() <= Duration::from_millis(TICK_MS),
            "{d:?} more than a tick late"
        );
        assert_eq!(d.fired_ms(), *now);
    }
    let keys: Vec<Vec<u8>> = out.iter().map(|(d, _)| d.key().to_vec()).collect();
    let expected: Vec<Vec<u8>> = at_t.iter().chain(&at_t5).cloned().collect();
    assert_eq!(keys.len(), expected.len());
    assert!(
        keys == expected,
        "not in deadline order, FIFO among equal deadlines"
    );
    // T is on a tick boundary; T + 5 ms rounds up to the next tick.
    assert!(out[..at_t.len()].iter().all(|(_, now)| *now == deadline));
    assert!(out[at_t.len()..]
        .iter()
        .all(|(_, now)| *now == deadline + TICK_MS));
    Ok(())
}

fn common_time(ms: u64) -> std::time::SystemTime {
    kairos::clock::ms_to_system_time(ms)
}

/// Scenario 5 — an earlier deadline wakes a sleeping driver: while the driver sleeps until A
/// (+50 s), another thread schedules B (+3 s) then C (+1 s): C fires at 1 s, B at 3 s, A at
/// 50 s — exactly, on a manual clock stepped every 100 ms.
#[test]
fn scenario_05_earlier_deadline_wakes_driver() -> TestResult {
    let h = SimHarness::new(5, config(Durability::Sync))?;
    h.engine()
        .schedule_after(b"A", Duration::from_secs(50), b"a")?;
    h.engine().run_until_idle(); // the driver now sleeps until A
    std::thread::scope(|s| -> TestResult {
        s.spawn(|| -> TestResult {
            h.engine()
                .schedule_after(b"B", Duration::from_secs(3), b"b")?;
            h.engine()
                .schedule_after(b"C", Duration::from_secs(1), b"c")?;
            Ok(())
        })
        .join()
        .map_err(|_| "scheduling thread panicked")?
    })?;
    let mut fired = Vec::new();
    for _ in 0..510 {
        let ds = h.advance(Duration::from_millis(100))?;
        h.engine().ack_many(&ds)?;
        for d in ds {
            fired.push((
                String::from_utf8_lossy(d.key()).into_owned(),
                h.clock.wall_ms() - START_MS,
            ));
        }
    }
    let expected = [("C", 1_000), ("B", 3_000), ("A", 50_000)];
    let expected: Vec<(String, u64)> = expected.iter().map(|(k, t)| (k.to_string(), *t)).collect();
    assert_eq!(fired, expected);
    Ok(())
}

/// Scenario 5 with the real clock and the real file system: the driver sleeps on a timed
/// wait until A (+50 s); B (+3 s) and C (+1 s) scheduled from another thread must wake
/// it. If they did not, C would come with A after 50 s and `recv_timeout` would give up.
#[test]
fn scenario_05_earlier_deadline_wakes_driver_real_clock() -> TestResult {
    let dir = tempfile::tempdir()?;
    let engine = Engine::open(dir.path(), Config::default())?;
    let consumer = engine.consumer();
    engine.schedule_after(b"A", Duration::from_secs(50), b"a")?;
    engine.run_until_idle();
    std::thread::scope(|s| -> TestResult {
        s.spawn(|| -> TestResult {
            // Both due times from one reading of the clock, as in the scenario (+3 s, +1 s):
            // a slow fdatasync (a loaded machine's disk) between the two calls must not put
            // C's due time after B's, and only a stall of seconds lets B fire first.
            let now = std::time::SystemTime::now();
            engine.schedule(b"B", Due::At(now + Duration::from_secs(3)), b"b")?;
            engine.schedule(b"C", Due::At(now + Duration::from_secs(1)), b"c")?;
            Ok(())
        })
        .join()
        .map_err(|_| "scheduling thread panicked")?
    })?;
    let first = consumer.recv_timeout(Duration::from_secs(20))?;
    let second = consumer.recv_timeout(Duration::from_secs(20))?;
    assert_eq!((first.key(), second.key()), (&b"C"[..], &b"B"[..]));
    for d in [&first, &second] {
        assert!(d.fired_ms() >= d.due_ms(), "{d:?} fired early");
    }
    assert!(consumer.try_recv().is_err(), "A fired early");
    assert_eq!(
        engine.cancel(b"A")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    engine.shutdown()?;
    Ok(())
}

/// Scenario 7 — cancel survives a crash: schedule +5 s, cancel at +1 s (Cancelled), crash and
/// reopen at +2 s, run past +10 s: it never fires; cancelling again says NotFound. Done for a
/// process crash and both kinds of power cut (the SIGKILL version is in `tests/crash.rs`).
#[test]
fn scenario_07_cancel_survives_crash() -> TestResult {
    for (seed, how) in [
        Stop::ProcessCrash,
        Stop::PowerCut,
        Stop::PowerCutDropUnsynced,
    ]
    .into_iter()
    .enumerate()
    {
        let mut h = SimHarness::new(70 + seed as u64, config(Durability::Sync))?;
        h.engine()
            .schedule_after(b"order:7:timeout", Duration::from_secs(5), b"cancel 7")?;
        h.engine()
            .schedule_after(b"other", Duration::from_secs(5), b"keep")?;
        assert!(h.advance(Duration::from_secs(1))?.is_empty());
        assert_eq!(
            h.engine().cancel(b"order:7:timeout")?,
            CancelOutcome::Cancelled { deliveries: 0 }
        );
        h.stop(how)?;
        h.clock.advance(Duration::from_secs(1));
        h.start()?;
        assert_eq!(h.engine().recovery().pending, 1, "{how:?}");
        let mut fired = Vec::new();
        for _ in 0..9 {
            fired.extend(h.advance(Duration::from_secs(1))?);
        }
        assert_eq!(
            by_key(&fired)?.keys().cloned().collect::<Vec<_>>(),
            vec![b"other".to_vec()],
            "{how:?}"
        );
        assert_eq!(
            h.engine().cancel(b"order:7:timeout")?,
            CancelOutcome::NotFound,
            "{how:?}"
        );
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// A backlog larger than one deliver frame (65 536 tasks) due at once after downtime is handed
/// out completely, oldest first, across a reopen.
#[test]
fn large_overdue_backlog_is_delivered_in_chunks() -> TestResult {
    let tasks = 70_000;
    let mut h = SimHarness::new(77, config(Durability::Buffered))?;
    let keys: Vec<Vec<u8>> = (0..tasks).map(|i| key("backlog-", i)).collect();
    for chunk in keys.chunks(10_000) {
        let batch: Vec<NewTask<'_>> = chunk
            .iter()
            .map(|k| NewTask {
                key: k,
                due: Due::After(Duration::from_secs(1)),
                payload: b"",
            })
            .collect();
        h.engine().schedule_many(&batch)?;
    }
    h.stop(Stop::Clean)?;
    h.clock.advance(Duration::from_secs(5));
    h.start()?;
    assert_eq!(h.engine().recovery().overdue, tasks);
    let got = drain(h.engine())?;
    assert_eq!(got.len(), tasks);
    assert!(got.windows(2).all(|w| w[0].task_id() < w[1].task_id()));
    h.stop(Stop::Clean)?;
    Ok(())
}
