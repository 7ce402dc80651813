//! What survives a restart, a process crash and a power cut, per durability mode.
//!
//! * Clean restart: every pending task comes back with its due time and payload, no cancelled
//!   task ever fires, and `Engine::recovery().pending` is exact.
//! * `Sync`: every acknowledged schedule, cancel and ack survives any power cut.
//! * `Interval` / `Buffered`: a power cut loses at most an unsynced *suffix*: what survives is
//!   the state after some prefix of the acknowledged operations, in order; a process crash
//!   loses nothing. The directory always reopens without manual repair.

mod common;

use common::{
    advance, by_key, config, drain, key, payload, scaled, SimHarness, SplitMix, Stop, TestResult,
    START_MS,
};
use kairos::{CancelOutcome, Durability, Engine, ManualClock};
use std::time::Duration;

/// Live tasks by key: (due_ms, payload).
type State = common::TaskMap;

/// One acknowledged operation of a random workload.
#[derive(Debug, Clone)]
enum Op {
    Schedule {
        key: Vec<u8>,
        due_ms: u64,
        payload: Vec<u8>,
    },
    Cancel {
        key: Vec<u8>,
    },
}

fn apply(state: &mut State, op: &Op) {
    match op {
        Op::Schedule {
            key,
            due_ms,
            payload,
        } => {
            state.insert(key.clone(), (*due_ms, payload.clone()));
        }
        Op::Cancel { key } => {
            state.remove(key);
        }
    }
}

/// The state after each prefix of `ops`: `states[k]` = after the first `k`.
fn prefix_states(ops: &[Op]) -> Vec<State> {
    let mut states = vec![State::new()];
    let mut s = State::new();
    for op in ops {
        apply(&mut s, op);
        states.push(s.clone());
    }
    states
}

/// How many of `ops` survived: the `k` whose prefix leaves exactly the state `got` (the
/// longest, should two prefixes leave the same); an error naming `case` if none does.
fn survived_prefix(ops: &[Op], got: &State, case: &str) -> TestResult<usize> {
    prefix_states(ops)
        .iter()
        .rposition(|s| s == got)
        .ok_or_else(|| {
            format!(
                "{case}: the {} surviving tasks are not the state after any prefix of the {} \
                 acknowledged operations",
                got.len(),
                ops.len()
            )
            .into()
        })
}

/// Runs `count` random schedules and cancels (all due 1–30 s ahead, so none fires) and returns
/// the acknowledged operations in order. Every call must succeed.
fn random_workload(
    engine: &Engine,
    now_ms: u64,
    rng: &mut SplitMix,
    count: usize,
) -> TestResult<Vec<Op>> {
    random_workload_with(engine, now_ms, rng, count, |_, _| Ok(()))
}

/// [`random_workload`], calling `before(engine, i)` before operation `i`.
fn random_workload_with(
    engine: &Engine,
    now_ms: u64,
    rng: &mut SplitMix,
    count: usize,
    mut before: impl FnMut(&Engine, usize) -> TestResult,
) -> TestResult<Vec<Op>> {
    let mut ops = Vec::with_capacity(count);
    let mut live: Vec<Vec<u8>> = Vec::new();
    for i in 0..count {
        before(engine, i)?;
        if !live.is_empty() && rng.chance(30) {
            let k = live.swap_remove(rng.next_u64() as usize % live.len());
            assert_eq!(
                engine.cancel(&k)?,
                CancelOutcome::Cancelled { deliveries: 0 },
                "cancel {i}"
            );
            ops.push(Op::Cancel { key: k });
        } else {
            let k = key("task-", i);
            let delay_ms = rng.range(1_000, 30_000);
            let p = payload("p", i, 200);
            engine.schedule_after(&k, Duration::from_millis(delay_ms), &p)?;
            live.push(k.clone());
            ops.push(Op::Schedule {
                key: k,
                due_ms: now_ms + delay_ms,
                payload: p,
            });
        }
    }
    Ok(ops)
}

/// Everything live in a freshly opened engine, observed the only way a user can: by letting
/// the clock pass every due time and receiving. Checks that nothing fires early.
fn observe_all(h: &SimHarness) -> TestResult<State> {
    let mut all = Vec::new();
    // Minute steps: each delivery must be due by the time it comes out.
    for _ in 0..2 {
        let ds = h.advance(Duration::from_secs(60))?;
        let now = h.clock.wall_ms();
        for d in &ds {
            assert!(
                d.due_ms() <= now,
                "{d:?} delivered before its due time {now}"
            );
        }
        all.extend(ds);
    }
    by_key(&all)
}

#[test]
fn restart_keeps_every_pending_task_and_no_cancelled_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let open = || common::open_fs(dir.path(), config(Durability::Sync), &clock);
    let engine = open()?;
    // Each schedule is one fdatasync on a real disk (a few ms): keep the count modest.
    let count = scaled(150, 3_000);
    let mut rng = SplitMix(0x5eed_0002);
    let ops = random_workload(&engine, START_MS, &mut rng, count)?;
    let expected = prefix_states(&ops).pop().unwrap_or_default();
    let cancelled: Vec<&Vec<u8>> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Cancel { key } => Some(key),
            Op::Schedule { .. } => None,
        })
        .collect();
    assert!(!cancelled.is_empty());
    engine.shutdown()?;
    drop(engine);

    let engine = open()?;
    let recovery = engine.recovery();
    assert_eq!(recovery.pending, expected.len());
    assert_eq!((recovery.overdue, recovery.redelivered), (0, 0));
    assert!(recovery.wal.clean_shutdown, "{recovery:?}");
    assert_eq!(recovery.wal.torn_tail, None);
    for k in &cancelled {
        assert_eq!(engine.cancel(k)?, CancelOutcome::NotFound);
    }
    // Second by second, each task exactly at its due time, in due-time order.
    let mut got = Vec::new();
    for _ in 0..31 {
        let ds = advance(&clock, &engine, Duration::from_secs(1))?;
        let now = clock.wall_ms();
        for d in &ds {
            assert!(
                d.due_ms() <= now && now - d.due_ms() < 1_000,
                "{d:?} at {now}"
            );
            assert_eq!(d.attempt(), 1);
        }
        got.extend(ds);
    }
    let dues: Vec<u64> = got.iter().map(|d| d.due_ms()).collect();
    assert!(
        dues.windows(2).all(|w| w[0] <= w[1]),
        "out of order: {dues:?}"
    );
    assert_eq!(by_key(&got)?, expected);
    for d in &got {
        engine.ack(d)?;
    }
    engine.shutdown()?;
    drop(engine);

    // Acked tasks are gone for good.
    let engine = open()?;
    assert_eq!(engine.recovery().pending, 0);
    assert!(advance(&clock, &engine, Duration::from_secs(3_600))?.is_empty());
    engine.shutdown()?;
    Ok(())
}

#[test]
fn power_cut_under_sync_keeps_every_acknowledged_schedule_cancel_and_ack() -> TestResult {
    for seed in 0..scaled(12, 200) as u64 {
        let mut h = SimHarness::new(seed, config(Durability::Sync))?;
        let mut rng = SplitMix(seed);
        let count = rng.range(1, 300) as usize;
        let ops = random_workload(h.engine(), START_MS, &mut rng, count)?;
        let mut expected = prefix_states(&ops).pop().unwrap_or_default();
        // Some tasks fire, some of those are acked: acks must survive too.
        let early = h.advance(Duration::from_secs(10))?;
        for d in early.iter().step_by(2) {
            h.engine().ack(d)?;
            expected.remove(d.key());
        }
        let unacked: State = early
            .iter()
            .skip(1)
            .step_by(2)
            .map(|d| (d.key().to_vec(), (d.due_ms(), d.payload().to_vec())))
            .collect();

        h.restart(Stop::PowerCut)?;
        let recovery = h.engine().recovery().clone();
        assert_eq!(
            recovery.pending,
            expected.len(),
            "seed {seed}: {recovery:?}"
        );
        assert_eq!(recovery.redelivered, unacked.len(), "seed {seed}");
        let redelivered = drain(h.engine())?;
        assert!(redelivered.iter().all(|d| d.attempt() == 2), "seed {seed}");
        assert_eq!(by_key(&redelivered)?, unacked, "seed {seed}");
        let mut got = observe_all(&h)?;
        got.extend(unacked);
        assert_eq!(got, expected, "seed {seed}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// Under a mode that does not sync every call, cuts the power after a random workload and
/// checks that what survives is exactly the state after a prefix of the acknowledged
/// operations. Returns how many operations survived in each run.
fn power_cut_loses_only_a_suffix(
    durability: Durability,
    how: Stop,
    seeds: u64,
) -> TestResult<Vec<(usize, usize)>> {
    let mut survived = Vec::new();
    for seed in 0..seeds {
        let mut h = SimHarness::new(1_000 + seed, config(durability))?;
        let mut rng = SplitMix(seed ^ 0xb0f);
        let count = rng.range(1, 300) as usize;
        let ops = random_workload(h.engine(), START_MS, &mut rng, count)?;
        // Every operation is one log record (LSN = its index + 1). A roll syncs the segment it
        // closes, so everything before the newest segment is durable in every mode.
        let newest = h.segments()?.pop().ok_or("no segment")?;
        let rolled_ops = (common::first_lsn_of(&newest)? - 1) as usize;
        // The directory must reopen as it is: no manual repair.
        h.restart(how)
            .map_err(|e| format!("{durability:?} seed {seed}: reopen failed: {e}"))?;
        let pending = h.engine().recovery().pending;
        let got = observe_all(&h)?;
        assert_eq!(pending, got.len(), "{durability:?} seed {seed}");
        let k = survived_prefix(&ops, &got, &format!("{durability:?} seed {seed}"))?;
        assert!(
            k >= rolled_ops,
            "{durability:?} seed {seed}: only {k} operations survived, but {rolled_ops} were in \
             segments closed (and synced) by a roll"
        );
        survived.push((k, count));
        h.stop(Stop::Clean)?;
    }
    Ok(survived)
}

#[test]
fn power_cut_under_interval_loses_only_an_unsynced_suffix() -> TestResult {
    let interval = Durability::Interval(Duration::from_millis(5));
    power_cut_loses_only_a_suffix(interval, Stop::PowerCut, scaled(8, 200) as u64)?;
    power_cut_loses_only_a_suffix(interval, Stop::PowerCutDropUnsynced, scaled(4, 100) as u64)?;
    Ok(())
}

#[test]
fn power_cut_under_buffered_loses_only_an_unsynced_suffix() -> TestResult {
    power_cut_loses_only_a_suffix(Durability::Buffered, Stop::PowerCut, scaled(8, 200) as u64)?;
    power_cut_loses_only_a_suffix(
        Durability::Buffered,
        Stop::PowerCutDropUnsynced,
        scaled(4, 100) as u64,
    )?;
    Ok(())
}

/// Under `Interval(d)` every call that returned before a background sync is durable: after
/// the workload, wait (on the disk's sync counter, not on a timer) for the background sync,
/// then cut the power — nothing may be lost.
#[test]
fn power_cut_under_interval_after_a_background_sync_loses_nothing() -> TestResult {
    for seed in 0..scaled(4, 100) as u64 {
        let mut h = SimHarness::new(
            3_000 + seed,
            config(Durability::Interval(Duration::from_millis(2))),
        )?;
        let mut rng = SplitMix(seed ^ 0x1e7);
        let count = rng.range(1, 300) as usize;
        let ops = random_workload(h.engine(), START_MS, &mut rng, count)?;
        // The writer thread writes and syncs in turn, so any sync that
        // completes after the last call returned covers it. The background
        // sync may also have completed before this read, leaving nothing to
        // sync (the writer then never syncs again): after a quiet spell of
        // 2 500 intervals, that is the case, and nothing may be lost either.
        let synced_before = h.sim.sync_count();
        let quiet_until = std::time::Instant::now() + Duration::from_secs(5);
        while h.sim.sync_count() == synced_before && std::time::Instant::now() < quiet_until {
            std::thread::yield_now();
        }
        h.restart(Stop::PowerCut)?;
        let expected = prefix_states(&ops).pop().unwrap_or_default();
        assert_eq!(observe_all(&h)?, expected, "seed {seed}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// `Engine::sync` in the modes that do not sync every call (`Interval` with an interval longer
/// than the test, and `Buffered`), with and without proof before acknowledgement: every call
/// that returned before it survives a power cut, whether the unsynced bytes are torn or
/// dropped; what came after it is lost at most as a suffix. Segments of 1 MiB, so that no roll
/// (which syncs the segment it closes) makes the calls durable instead.
#[test]
fn sync_makes_every_earlier_call_survive_a_power_cut() -> TestResult {
    let modes = [
        Durability::Interval(Duration::from_secs(3_600)),
        Durability::Buffered,
    ];
    for durability in modes {
        for (how, proof) in [
            (Stop::PowerCut, true),
            (Stop::PowerCutDropUnsynced, true),
            (Stop::PowerCutDropUnsynced, false),
        ] {
            for seed in 0..scaled(6, 100) as u64 {
                let mut c = config(durability);
                c.segment_bytes = 1 << 20;
                c.proof_before_ack = proof;
                let mut h = SimHarness::new(4_000 + seed, c)?;
                let mut rng = SplitMix(seed ^ 0x5c);
                let count = rng.range(2, 300) as usize;
                // Before operation `synced` (never after the last: a sync must run).
                let synced = rng.range(1, count as u64 - 1) as usize;
                let ops = random_workload_with(h.engine(), START_MS, &mut rng, count, |e, i| {
                    if i == synced {
                        e.sync()?;
                    }
                    Ok(())
                })?;
                h.restart(how)?;
                let got = observe_all(&h)?;
                let case = format!("{durability:?} {how:?} proof {proof} seed {seed}");
                let k = survived_prefix(&ops, &got, &case)?;
                assert!(
                    k >= synced,
                    "{durability:?} {how:?} proof {proof} seed {seed}: {k} operations \
                     survived, but {synced} returned before a sync"
                );
                h.stop(Stop::Clean)?;
            }
        }
    }
    Ok(())
}

/// `Engine::sync` where there is nothing to do: under `Sync` after the calls returned (no
/// fdatasync), in an in-memory engine, and twice in a row (the second syncs nothing); after
/// shutdown it is `Closed`.
#[test]
fn sync_with_nothing_to_sync_returns_at_once_and_after_shutdown_is_closed() -> TestResult {
    let mut h = SimHarness::new(5_000, config(Durability::Sync))?;
    h.engine()
        .schedule_after(b"a", Duration::from_secs(1), b"x")?;
    let before = h.sim.sync_count();
    h.engine().sync()?;
    assert_eq!(h.sim.sync_count(), before, "sync under Sync synced again");
    h.restart(Stop::Clean)?;
    let e = h.engine();
    e.sync()?;
    e.shutdown()?;
    assert!(matches!(e.sync(), Err(kairos::SyncError::Closed)));

    let mut b = SimHarness::new(5_001, config(Durability::Buffered))?;
    b.engine()
        .schedule_after(b"b", Duration::from_secs(1), b"y")?;
    let before = b.sim.sync_count();
    b.engine().sync()?;
    let once = b.sim.sync_count();
    assert!(once > before, "sync under Buffered did not fdatasync");
    b.engine().sync()?;
    assert_eq!(
        b.sim.sync_count(),
        once,
        "a second sync with nothing new synced again"
    );
    b.stop(Stop::Clean)?;

    let clock = ManualClock::new(START_MS);
    let m = Engine::in_memory(kairos::Config::default(), std::sync::Arc::new(clock))?;
    m.schedule_after(b"c", Duration::from_secs(1), b"z")?;
    m.sync()?;
    Ok(())
}

/// A shutdown while a `sync` waits for its fdatasync (slowed down on the simulated disk) closes
/// the log cleanly and releases the directory: the waiting sync holds no claim on the log. (It
/// held the log itself once, and the shutdown then failed as "still in use", wrote no clean
/// close and left the log's writer running.) The sync returns `Ok` or `Closed`, never hangs.
#[test]
fn a_shutdown_while_a_sync_waits_closes_the_log_cleanly() -> TestResult {
    for durability in [
        Durability::Buffered,
        Durability::Interval(Duration::from_secs(3_600)),
    ] {
        let mut h = SimHarness::new(6_000, config(durability))?;
        h.engine()
            .schedule_after(b"a", Duration::from_secs(1), b"x")?;
        h.sim.set_sync_latency(Duration::from_millis(300));
        let engine = h.engine();
        let (synced, shut) = std::thread::scope(|s| {
            let syncing = s.spawn(|| engine.sync());
            // A race on purpose: the sync is most likely inside its fdatasync by then. If it has
            // not started yet, it answers `Closed` and the test still checks the shutdown.
            std::thread::sleep(Duration::from_millis(100));
            let shut = engine.shutdown();
            (syncing.join(), shut)
        });
        h.sim.set_sync_latency(Duration::ZERO);
        shut.map_err(|e| format!("{durability:?}: shutdown failed: {e}"))?;
        let synced = synced.map_err(|_| "the syncing thread panicked")?;
        assert!(
            matches!(synced, Ok(()) | Err(kairos::SyncError::Closed)),
            "{durability:?}: {synced:?}"
        );
        // The directory is free at once, and its log closed cleanly.
        h.restart(Stop::ProcessCrash)?;
        assert!(
            h.engine().recovery().wal.clean_shutdown,
            "{durability:?}: the log was not closed cleanly"
        );
        assert_eq!(h.engine().recovery().pending, 1);
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// A failed fdatasync in `Engine::sync` poisons the engine with a typed error, and every later
/// call says `Poisoned`; what returned before the failed sync under `Buffered` survives a
/// process crash.
#[test]
fn a_failed_sync_poisons_the_engine() -> TestResult {
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let mut h = SimHarness::new(5_002, config(Durability::Buffered))?;
    h.engine()
        .schedule_after(b"kept", Duration::from_secs(1), b"k")?;
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    match h.engine().sync() {
        Err(kairos::SyncError::Poisoned { cause }) => assert!(!cause.is_empty()),
        other => return Err(format!("expected Poisoned, got {other:?}").into()),
    }
    assert!(matches!(
        h.engine().sync(),
        Err(kairos::SyncError::Poisoned { .. })
    ));
    assert!(matches!(
        h.engine()
            .schedule_after(b"later", Duration::from_secs(1), b""),
        Err(kairos::ScheduleError::Poisoned { .. })
    ));
    h.restart(Stop::ProcessCrash)?;
    let got = observe_all(&h)?;
    assert_eq!(got.len(), 1);
    assert_eq!(
        got.get(b"kept".as_slice()),
        Some(&(START_MS + 1_000, b"k".to_vec()))
    );
    h.stop(Stop::Clean)?;
    Ok(())
}

/// A failed background sync under `Interval` — the log's writer thread's, with no call
/// waiting for it — poisons the engine at once: a consumer blocked in `recv` wakes with
/// `Poisoned` (before, it waited until some later call appended and found the log poisoned),
/// and what returned before the failure survives a process crash.
#[test]
fn a_failed_background_sync_wakes_a_blocked_consumer() -> TestResult {
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let mut h = SimHarness::new(
        5_003,
        config(Durability::Interval(Duration::from_millis(1))),
    )?;
    let consumer = h.engine().consumer();
    // The simulated storage allows no timed I/O here: the next fdatasync is the writer
    // thread's interval sync of the schedule below.
    h.sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    // Due in a second of the manual clock, which stands still: nothing falls due, so only
    // the poisoning can end the wait below before its minute.
    h.engine()
        .schedule_after(b"kept", Duration::from_secs(1), b"k")?;
    match consumer.recv_timeout(Duration::from_secs(60)) {
        Err(kairos::RecvError::Poisoned { cause }) => {
            assert!(cause.contains("fdatasync"), "{cause}")
        }
        other => return Err(format!("expected Poisoned, got {other:?}").into()),
    }
    assert_eq!(h.sim.faults_fired(), 1);
    assert!(matches!(
        h.engine()
            .schedule_after(b"later", Duration::from_secs(1), b""),
        Err(kairos::ScheduleError::Poisoned { .. })
    ));
    h.restart(Stop::ProcessCrash)?;
    let got = observe_all(&h)?;
    assert_eq!(got.len(), 1);
    assert_eq!(
        got.get(b"kept".as_slice()),
        Some(&(START_MS + 1_000, b"k".to_vec()))
    );
    h.stop(Stop::Clean)?;
    Ok(())
}

#[test]
fn process_crash_loses_nothing_in_any_mode() -> TestResult {
    let modes = [
        Durability::Sync,
        Durability::Interval(Duration::from_secs(3_600)),
        Durability::Buffered,
    ];
    for durability in modes {
        for seed in 0..scaled(3, 50) as u64 {
            let mut h = SimHarness::new(2_000 + seed, config(durability))?;
            let mut rng = SplitMix(seed ^ 0xc4a5);
            let count = rng.range(1, 300) as usize;
            let ops = random_workload(h.engine(), START_MS, &mut rng, count)?;
            h.restart(Stop::ProcessCrash)?;
            let expected = prefix_states(&ops).pop().unwrap_or_default();
            assert_eq!(
                h.engine().recovery().pending,
                expected.len(),
                "{durability:?} seed {seed}"
            );
            assert_eq!(observe_all(&h)?, expected, "{durability:?} seed {seed}");
            h.stop(Stop::Clean)?;
        }
    }
    Ok(())
}
