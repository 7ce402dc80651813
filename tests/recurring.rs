//! `ack_and_schedule`: a delivery's ack and the next task under the same key in one log
//! write — the recurring task made crash-safe. Exact deliveries under a manual clock;
//! all-or-nothing across power cuts (after a return, after a failed write, and at random
//! tears of an unsynced log); a cancel while held ends the series; every refusal changes
//! nothing; at most once it is a plain schedule.

mod common;

use common::{
    advance, config, drain, memory_engine, scaled, SimHarness, Stop, TestResult, START_MS,
};
use kairos::{
    AckError, AckScheduleError, AckScheduleOutcome, CancelOutcome, Config, Delivery,
    DeliveryGuarantee, Due, Durability, ScheduleError, TaskId,
};
use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3_600);
const HOUR_MS: u64 = 3_600_000;

/// The one delivery `ds` must hold.
fn only(ds: Vec<Delivery>) -> TestResult<Delivery> {
    match <[Delivery; 1]>::try_from(ds) {
        Ok([d]) => Ok(d),
        Err(ds) => Err(format!("expected one delivery, got {}", ds.len()).into()),
    }
}

fn scheduled(outcome: AckScheduleOutcome) -> TestResult<TaskId> {
    match outcome {
        AckScheduleOutcome::Scheduled(id) => Ok(id),
        other => Err(format!("expected Scheduled, got {other:?}").into()),
    }
}

/// A report every hour under one key, six runs: each delivery exactly at its due time with
/// the payload the previous run passed on, a new id each time, the old delivery finished,
/// and the totals exact.
#[test]
fn a_recurring_task_fires_every_interval_under_one_key() -> TestResult {
    let (engine, clock) = memory_engine(Config::default())?;
    let consumer = engine.consumer();
    let first = engine.schedule_after(b"report:daily", HOUR, b"run-0")?;
    let mut ids = vec![first];
    let mut previous: Option<Delivery> = None;
    for run in 0..6u64 {
        let d = only(advance(&clock, &engine, HOUR)?)?;
        assert_eq!(d.key(), b"report:daily");
        assert_eq!(d.payload(), format!("run-{run}").as_bytes());
        assert_eq!(d.due_ms(), START_MS + (run + 1) * HOUR_MS);
        assert_eq!(d.fired_ms(), d.due_ms());
        assert_eq!(d.attempt(), 1);
        assert_eq!(d.task_id(), *ids.last().ok_or("no id")?);
        if let Some(p) = &previous {
            // The occurrence before is finished: acked by the call that made this one.
            assert_eq!(
                consumer.ack(p),
                Err(AckError::NotOutstanding {
                    task_id: p.task_id().0
                })
            );
        }
        let next = format!("run-{}", run + 1);
        let id =
            scheduled(consumer.ack_and_schedule(&d, Due::At(d.due() + HOUR), next.as_bytes())?)?;
        assert!(!ids.contains(&id), "id {id:?} reused");
        ids.push(id);
        let info = engine.lookup(b"report:daily")?.ok_or("no live task")?;
        assert_eq!(
            (info.id, info.due_ms, info.deliveries),
            (id, d.due_ms() + HOUR_MS, 0)
        );
        let s = engine.stats();
        assert_eq!((s.pending, s.in_flight), (1, 0));
        assert_eq!(
            (s.tasks_scheduled, s.acks, s.deliveries),
            (run + 2, run + 1, run + 1)
        );
        previous = Some(d);
    }
    // Nothing fires before the seventh occurrence's due time.
    assert!(advance(&clock, &engine, HOUR - Duration::from_millis(1))?.is_empty());
    assert_eq!(
        only(advance(&clock, &engine, Duration::from_millis(1))?)?.payload(),
        b"run-6"
    );
    engine.shutdown()?;
    Ok(())
}

/// Under `Sync`, a returned `ack_and_schedule` survives a power cut whole: the old occurrence
/// is not delivered again, the new one is pending with its due time and payload — also after
/// a checkpoint and a far due time (30 days: out of the wheel's resident window).
#[test]
fn a_returned_ack_and_schedule_survives_a_power_cut() -> TestResult {
    for (i, delay) in [HOUR, Duration::from_secs(30 * 86_400)]
        .into_iter()
        .enumerate()
    {
        for checkpoint in [false, true] {
            let mut h = SimHarness::new(40 + i as u64, config(Durability::Sync))?;
            h.engine().schedule_after(b"job", HOUR, b"old")?;
            h.engine().schedule_after(b"other", 2 * HOUR, b"o")?;
            let d = only(h.advance(HOUR)?)?;
            let id = scheduled(h.engine().ack_and_schedule(&d, Due::After(delay), b"new")?)?;
            if checkpoint {
                h.engine().checkpoint()?;
            }
            h.restart(Stop::PowerCut)?;
            let r = h.engine().recovery().clone();
            assert_eq!((r.pending, r.redelivered), (2, 0), "{r:?}");
            let info = h.engine().lookup(b"job")?.ok_or("job lost")?;
            let due_ms = START_MS + HOUR_MS + delay.as_millis() as u64;
            assert_eq!((info.id, info.due_ms, info.deliveries), (id, due_ms, 0));
            let later = h.advance(delay)?;
            let mut fired: Vec<(&[u8], &[u8], u64)> = later
                .iter()
                .map(|d| (d.key(), d.payload(), d.due_ms()))
                .collect();
            fired.sort();
            let mut expected = vec![(b"job".as_slice(), b"new".as_slice(), due_ms)];
            expected.push((b"other", b"o", START_MS + 2 * HOUR_MS));
            expected.sort();
            assert_eq!(fired, expected);
            h.stop(Stop::Clean)?;
        }
    }
    Ok(())
}

/// The frame holding the ack and the schedule fails to write (a short write, then EIO): the
/// call answers `Poisoned`, and after a power cut the old occurrence is delivered again and
/// no new task exists — neither half took effect.
#[test]
fn a_failed_write_undoes_both_halves() -> TestResult {
    for kind in [FaultKind::Eio, FaultKind::ShortWrite] {
        let mut h = SimHarness::new(7, config(Durability::Sync))?;
        let old = h.engine().schedule_after(b"job", HOUR, b"old")?;
        let d = only(h.advance(HOUR)?)?;
        h.sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Write,
            kind,
        });
        match h.engine().ack_and_schedule(&d, Due::After(HOUR), b"new") {
            Err(AckScheduleError::Ack(AckError::Poisoned { cause })) => {
                assert!(!cause.is_empty())
            }
            other => return Err(format!("{kind:?}: expected Poisoned, got {other:?}").into()),
        }
        h.restart(Stop::PowerCut)?;
        let r = h.engine().recovery().clone();
        assert_eq!((r.pending, r.redelivered), (1, 1), "{kind:?}: {r:?}");
        let again = only(drain(h.engine())?)?;
        assert_eq!(
            (again.task_id(), again.payload(), again.attempt()),
            (old, b"old".as_slice(), 2)
        );
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// Under `Buffered` nothing is synced, so a power cut tears the log at a random point: for
/// every seed the key holds either the old occurrence (its delivery comes again) or the new
/// one with its exact due time and payload; never neither (an ack without its schedule), and
/// the log always reopens.
#[test]
fn a_power_cut_keeps_both_halves_or_neither() -> TestResult {
    let mut seen = [0usize; 2];
    for seed in 0..scaled(48, 400) as u64 {
        let mut c = config(Durability::Buffered);
        c.segment_bytes = 1 << 20;
        let mut h = SimHarness::new(1_000 + seed, c)?;
        let old = h.engine().schedule_after(b"job", HOUR, b"old")?;
        let d = only(h.advance(HOUR)?)?;
        // Everything before the call durable: only its frame is at stake.
        h.engine().sync()?;
        let new = scheduled(h.engine().ack_and_schedule(&d, Due::After(HOUR), b"new")?)?;
        h.restart(Stop::PowerCut)?;
        let info = h.engine().lookup(b"job")?.ok_or(format!(
            "seed {seed}: the ack survived without the schedule"
        ))?;
        if info.id == old {
            assert_eq!(info.due_ms, START_MS + HOUR_MS, "seed {seed}");
            let again = only(drain(h.engine())?)?;
            assert_eq!((again.task_id(), again.attempt()), (old, 2), "seed {seed}");
            seen[0] += 1;
        } else {
            assert_eq!(
                (info.id, info.due_ms, info.deliveries),
                (new, START_MS + 2 * HOUR_MS, 0),
                "seed {seed}"
            );
            let next = only(h.advance(HOUR)?)?;
            assert_eq!((next.task_id(), next.payload()), (new, b"new".as_slice()));
            seen[1] += 1;
        }
        h.stop(Stop::Clean)?;
    }
    // Both outcomes occur, or the test would not tell anything.
    assert!(seen[0] > 0 && seen[1] > 0, "outcomes (old, new): {seen:?}");
    Ok(())
}

/// A cancel while the consumer holds the task answers `AlreadyDelivered`; the holder's
/// `ack_and_schedule` then acks and schedules nothing — also when the freed key was scheduled
/// anew meanwhile, whose task it leaves alone.
#[test]
fn a_cancel_while_held_ends_the_series() -> TestResult {
    for reuse in [false, true] {
        let (engine, clock) = memory_engine(Config::default())?;
        engine.schedule_after(b"job", HOUR, b"old")?;
        let d = only(advance(&clock, &engine, HOUR)?)?;
        assert_eq!(
            engine.cancel(b"job")?,
            CancelOutcome::AlreadyDelivered { attempt: 1 }
        );
        let other = if reuse {
            Some(engine.schedule_after(b"job", 5 * HOUR, b"other")?)
        } else {
            None
        };
        assert_eq!(
            engine.ack_and_schedule(&d, Due::After(HOUR), b"new")?,
            AckScheduleOutcome::CancelledWhileHeld
        );
        let live = engine.lookup(b"job")?.map(|t| (t.id, t.due_ms));
        assert_eq!(live, other.map(|id| (id, START_MS + 6 * HOUR_MS)));
        let s = engine.stats();
        assert_eq!((s.acks, s.in_flight, s.pending), (1, 0, usize::from(reuse)));
        assert_eq!(s.tasks_scheduled, 1 + u64::from(reuse));
        assert!(advance(&clock, &engine, 4 * HOUR)?.is_empty());
        engine.shutdown()?;
    }
    Ok(())
}

/// Every refusal leaves the delivery as it was (still held: a plain ack then succeeds) and
/// schedules nothing; a lease run out is `LeaseExpired` and the task is retried as before;
/// a delivery already acked this way is `NotOutstanding`; after shutdown, `Closed`.
#[test]
fn refusals_change_nothing() -> TestResult {
    let mut c = Config::default();
    c.lease = Duration::from_secs(1);
    c.payload_bytes_max = 64;
    let (engine, clock) = memory_engine(c)?;
    engine.schedule_after(b"job", HOUR, b"old")?;
    let d = only(advance(&clock, &engine, HOUR)?)?;
    let too_big = vec![0u8; 65];
    assert_eq!(
        engine.ack_and_schedule(&d, Due::After(HOUR), &too_big),
        Err(AckScheduleError::Schedule(ScheduleError::PayloadTooLarge {
            bytes: 65,
            max: 64
        }))
    );
    let too_far = engine.config().delay_max + Duration::from_secs(1);
    assert!(matches!(
        engine.ack_and_schedule(&d, Due::After(too_far), b"x"),
        Err(AckScheduleError::Schedule(ScheduleError::DueTooFar { .. }))
    ));
    assert!(matches!(
        engine.ack_and_schedule(&d, Due::At(std::time::UNIX_EPOCH - HOUR), b"x"),
        Err(AckScheduleError::Schedule(ScheduleError::DueBeforeEpoch))
    ));
    let s = engine.stats();
    assert_eq!((s.acks, s.tasks_scheduled, s.in_flight), (0, 1, 1));
    assert!(engine.consumer().holds(&d)?);
    // The lease runs out: the attempt is over, the task comes again.
    assert!(advance(&clock, &engine, Duration::from_secs(1))?.is_empty());
    assert_eq!(
        engine.ack_and_schedule(&d, Due::After(HOUR), b"new"),
        Err(AckScheduleError::Ack(AckError::LeaseExpired {
            task_id: d.task_id().0
        }))
    );
    let again = only(advance(&clock, &engine, Duration::from_secs(60))?)?;
    assert_eq!((again.task_id(), again.attempt()), (d.task_id(), 2));
    let id = scheduled(engine.ack_and_schedule(&again, Due::After(HOUR), b"new")?)?;
    assert_eq!(
        engine.ack_and_schedule(&again, Due::After(HOUR), b"newer"),
        Err(AckScheduleError::Ack(AckError::NotOutstanding {
            task_id: again.task_id().0
        }))
    );
    let info = engine.lookup(b"job")?.ok_or("job lost")?;
    assert_eq!(info.id, id);
    engine.shutdown()?;
    assert_eq!(
        engine.ack_and_schedule(&again, Due::After(HOUR), b"x"),
        Err(AckScheduleError::Ack(AckError::Closed))
    );
    Ok(())
}

/// At most once the delivery finished when it was received: the call is a plain schedule of
/// its key — `AlreadyExists` (as `Schedule`) when the key was scheduled since.
#[test]
fn at_most_once_it_is_a_plain_schedule() -> TestResult {
    let mut c = Config::default();
    c.delivery = DeliveryGuarantee::AtMostOnce;
    let (engine, clock) = memory_engine(c)?;
    engine.schedule_after(b"job", HOUR, b"old")?;
    engine.schedule_after(b"taken", HOUR, b"t")?;
    let mut ds = advance(&clock, &engine, HOUR)?;
    ds.sort_by(|a, b| a.key().cmp(b.key()));
    let [job, taken] = <[Delivery; 2]>::try_from(ds).map_err(|_| "two deliveries")?;
    let id = scheduled(engine.ack_and_schedule(&job, Due::After(HOUR), b"new")?)?;
    assert_eq!(engine.lookup(b"job")?.map(|t| t.id), Some(id));
    let other = engine.schedule_after(b"taken", HOUR, b"again")?;
    assert_eq!(
        engine.ack_and_schedule(&taken, Due::After(HOUR), b"x"),
        Err(AckScheduleError::Schedule(ScheduleError::AlreadyExists {
            key: "taken".into()
        }))
    );
    assert_eq!(engine.lookup(b"taken")?.map(|t| t.id), Some(other));
    let s = engine.stats();
    assert_eq!((s.acks, s.tasks_scheduled, s.pending), (0, 4, 2));
    engine.shutdown()?;
    Ok(())
}
