//! The running totals of `Stats` — `tasks_scheduled`, `tasks_rescheduled`, `tasks_cancelled`,
//! `deliveries`, `acks`, `nacks`, `lease_expiries`, `retries`, `tasks_dead_lettered` — checked
//! exactly, after every step, against counts this test keeps from the answers the engine gave:
//! schedules (one, `schedule_after`, `schedule_at`, batches, refusals), cancels (`Cancelled`
//! of a waiting, a due-but-unreceived and a retrying task, `AlreadyDelivered`, `NotFound`,
//! `cancel_many` with a key twice), reschedules (of a live task, of a due one, of a free key),
//! deliveries and redeliveries, acks (one, many, of a task cancelled while held, refused),
//! nacks (retry, dead letter, finished, refused), `ack_and_schedule` (live, cancelled while
//! held, refused), lease expiries (retry, dead letter, of a task
//! cancelled while held), requeue and purge of dead letters, and at-most-once deliveries.
//! Every check also holds the three relations `Stats` documents between the totals. Then a
//! reopen of a disk engine (with far tasks cancelled and rescheduled) starts every total at 0,
//! after a clean shutdown and after a crash.
//!
//! Time moves only when the test moves it (`ManualClock`, then `run_until_idle`).

mod common;

use common::far::{at as far_at, cfg as far_cfg, due as far_due, key as far_key};
use common::{drain, open_fs, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::{
    AckError, AckScheduleError, AckScheduleOutcome, CancelOutcome, Config, Delivery,
    DeliveryGuarantee, Due, Engine, ManualClock, NackOutcome, NewTask, RescheduleOutcome,
    ScheduleError, Stats,
};
use std::sync::Arc;
use std::time::Duration;

/// The task totals of [`Stats`], as this test counts them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Totals {
    scheduled: u64,
    rescheduled: u64,
    cancelled: u64,
    deliveries: u64,
    acks: u64,
    nacks: u64,
    lease_expiries: u64,
    retries: u64,
    dead_lettered: u64,
    requeued: u64,
    purged: u64,
}

fn totals(s: &Stats) -> Totals {
    Totals {
        scheduled: s.tasks_scheduled,
        rescheduled: s.tasks_rescheduled,
        cancelled: s.tasks_cancelled,
        deliveries: s.deliveries,
        acks: s.acks,
        nacks: s.nacks,
        lease_expiries: s.lease_expiries,
        retries: s.retries,
        dead_lettered: s.tasks_dead_lettered,
        requeued: s.dead_letters_requeued,
        purged: s.dead_letters_purged,
    }
}

/// The engine's totals are `expected`, and (at least once) the relations `Stats` documents
/// hold: `deliveries == acks + nacks + lease_expiries + in_flight`, and `nacks +
/// lease_expiries == retries + tasks_dead_lettered + finished`, where `finished` counts the
/// failed attempts (nack or lease expiry) of tasks cancelled while held.
#[track_caller]
fn check(engine: &Engine, expected: &Totals, finished: u64, step: &str) {
    let s = engine.stats();
    assert_eq!(totals(&s), *expected, "after {step}: {s:?}");
    assert_eq!(
        s.dead_letters as u64 + s.dead_letters_requeued + s.dead_letters_purged,
        engine.recovery().dead_letters as u64 + s.tasks_dead_lettered,
        "after {step}: dead letters kept against made, requeued and purged: {s:?}"
    );
    if engine.config().delivery == DeliveryGuarantee::AtLeastOnce {
        assert_eq!(
            s.deliveries,
            s.acks + s.nacks + s.lease_expiries + s.in_flight as u64,
            "after {step}: deliveries against their ends: {s:?}"
        );
        assert_eq!(
            s.nacks + s.lease_expiries,
            s.retries + s.tasks_dead_lettered + finished,
            "after {step}: failed attempts against what followed: {s:?}"
        );
    }
}

/// A lease of 1 s, two attempts, a fixed backoff of 1 s, no jitter.
fn cfg() -> Config {
    let mut c = Config::default();
    c.lease = Duration::from_secs(1);
    c.retry.max_attempts = 2;
    c.retry.backoff_initial = Duration::from_secs(1);
    c.retry.backoff_max = Duration::from_secs(1);
    c.retry.backoff_multiplier = 1;
    c.retry.backoff_jitter_percent = 0;
    c
}

fn secs(n: u64) -> Due {
    Due::After(Duration::from_secs(n))
}

/// Moves the clock by `ms` and takes everything then ready.
fn advance(clock: &ManualClock, engine: &Engine, ms: u64) -> TestResult<Vec<Delivery>> {
    clock.advance(Duration::from_millis(ms));
    drain(engine)
}

/// The deliveries' keys and attempts, sorted.
fn got(ds: &[Delivery]) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = ds
        .iter()
        .map(|d| (String::from_utf8_lossy(d.key()).into_owned(), d.attempt()))
        .collect();
    v.sort();
    v
}

/// `list` as [`got`] gives it.
fn want(list: &[(&str, u32)]) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = list.iter().map(|&(k, a)| (k.to_owned(), a)).collect();
    v.sort();
    v
}

/// The delivery of `key` among `ds`.
fn of<'a>(ds: &'a [Delivery], key: &str) -> TestResult<&'a Delivery> {
    ds.iter()
        .find(|d| d.key() == key.as_bytes())
        .ok_or_else(|| format!("no delivery of {key}").into())
}

const C0: CancelOutcome = CancelOutcome::Cancelled { deliveries: 0 };
const NF: CancelOutcome = CancelOutcome::NotFound;

#[test]
fn every_total_counts_exactly_what_its_doc_says() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(cfg(), Arc::new(clock.clone()))?;
    let consumer = engine.consumer();
    let mut exp = Totals::default();
    let mut finished = 0;
    check(&engine, &exp, finished, "open");

    // Schedules of every kind; refusals count nothing.
    for i in 0..6 {
        engine.schedule(format!("s{i}").as_bytes(), secs(1), b"p")?;
        exp.scheduled += 1;
    }
    engine.schedule_after(b"after", Duration::from_secs(1), b"p")?;
    engine.schedule_at(b"at", ms_to_system_time(START_MS + 1000), b"p")?;
    exp.scheduled += 2;
    let batch: Vec<NewTask<'_>> = ["m0", "m1", "m2"]
        .iter()
        .map(|k| NewTask {
            key: k.as_bytes(),
            due: secs(1),
            payload: b"p",
        })
        .collect();
    assert_eq!(engine.schedule_many(&batch)?.len(), 3);
    exp.scheduled += 3;
    check(&engine, &exp, finished, "schedules");
    assert!(matches!(
        engine.schedule(b"s0", secs(1), b"p"),
        Err(ScheduleError::AlreadyExists { .. })
    ));
    assert_eq!(
        engine.schedule(b"", secs(1), b"p"),
        Err(ScheduleError::EmptyKey)
    );
    let twice = [batch[0], batch[0]];
    assert!(matches!(
        engine.schedule_many(&twice),
        Err(ScheduleError::DuplicateKeyInBatch { .. })
    ));
    let one_live = [
        NewTask {
            key: b"fresh",
            due: secs(1),
            payload: b"p",
        },
        batch[1],
    ];
    assert!(matches!(
        engine.schedule_many(&one_live),
        Err(ScheduleError::AlreadyExists { .. })
    ));
    assert!(engine.lookup(b"fresh")?.is_none());
    check(&engine, &exp, finished, "refused schedules");

    // Cancels of waiting tasks: only `Cancelled` counts.
    assert_eq!(engine.cancel(b"s5")?, C0);
    exp.cancelled += 1;
    assert_eq!(engine.cancel(b"s5")?, NF);
    assert_eq!(engine.cancel(b"never")?, NF);
    assert_eq!(
        engine.cancel_many(&[b"m2", b"m2", b"never", b"at"])?,
        vec![C0, NF, NF, C0]
    );
    exp.cancelled += 2;
    check(&engine, &exp, finished, "cancels of waiting tasks");

    // Reschedules: of a live task, of a free key (a new task), refused.
    assert!(matches!(
        engine.reschedule(b"s4", secs(1), Some(b"q"))?,
        RescheduleOutcome::Rescheduled(_)
    ));
    exp.rescheduled += 1;
    assert!(matches!(
        engine.reschedule(b"up", secs(1), Some(b"u"))?,
        RescheduleOutcome::Scheduled(_)
    ));
    exp.scheduled += 1;
    assert_eq!(
        engine.reschedule(b"", secs(1), None),
        Err(ScheduleError::EmptyKey)
    );
    check(&engine, &exp, finished, "reschedules");

    // Everything falls due and is handed out; before any consumer takes them, one is
    // cancelled and one rescheduled: neither is a delivery.
    clock.advance(Duration::from_secs(1));
    engine.run_until_idle();
    assert_eq!(engine.stats().ready, 9);
    assert_eq!(engine.cancel(b"after")?, C0);
    exp.cancelled += 1;
    assert!(matches!(
        engine.reschedule(b"up", secs(5), None)?,
        RescheduleOutcome::Rescheduled(_)
    ));
    exp.rescheduled += 1;
    check(
        &engine,
        &exp,
        finished,
        "cancel and reschedule of ready tasks",
    );
    let first = drain(&engine)?;
    assert_eq!(
        got(&first),
        want(&[
            ("s0", 1),
            ("s1", 1),
            ("s2", 1),
            ("s3", 1),
            ("s4", 1),
            ("m0", 1),
            ("m1", 1)
        ])
    );
    exp.deliveries += 7;
    check(&engine, &exp, finished, "first deliveries");

    // Answers.
    consumer.ack(of(&first, "s0")?)?;
    exp.acks += 1;
    engine.ack_many(&[of(&first, "s1")?.clone(), of(&first, "m0")?.clone()])?;
    exp.acks += 2;
    check(&engine, &exp, finished, "acks");
    // Refused acks count nothing; a refused `ack_many` acks none of its deliveries.
    assert!(matches!(
        consumer.ack(of(&first, "s0")?),
        Err(AckError::NotOutstanding { .. })
    ));
    let s2 = of(&first, "s2")?;
    assert!(matches!(
        engine.ack_many(&[s2.clone(), s2.clone()]),
        Err(AckError::NotOutstanding { .. })
    ));
    check(&engine, &exp, finished, "refused acks");
    assert!(matches!(
        consumer.nack(s2, None, "failed")?,
        NackOutcome::Retry {
            next_attempt: 2,
            ..
        }
    ));
    exp.nacks += 1;
    exp.retries += 1;
    assert!(matches!(
        consumer.nack(s2, None, "again"),
        Err(AckError::LeaseExpired { .. })
    ));
    assert!(matches!(
        consumer.ack(s2),
        Err(AckError::LeaseExpired { .. })
    ));
    check(&engine, &exp, finished, "nack with retry");
    // Cancelled while held: `AlreadyDelivered` is not a cancel; the holder's ack or nack,
    // or the lease's end, counts when it comes.
    for k in ["s3", "m1", "s4"] {
        assert_eq!(
            engine.cancel(k.as_bytes())?,
            CancelOutcome::AlreadyDelivered { attempt: 1 }
        );
    }
    check(&engine, &exp, finished, "cancels of held tasks");
    consumer.ack(of(&first, "s3")?)?;
    exp.acks += 1;
    assert_eq!(
        consumer.nack(of(&first, "m1")?, None, "x")?,
        NackOutcome::Finished
    );
    exp.nacks += 1;
    finished += 1;
    check(&engine, &exp, finished, "answers of cancelled held tasks");
    assert_eq!(engine.stats().in_flight, 1);

    // 1.1 s on: the lease of s4 (cancelled while held) ends, s2's retry is delivered.
    let second = advance(&clock, &engine, 1100)?;
    exp.lease_expiries += 1;
    finished += 1;
    assert_eq!(got(&second), want(&[("s2", 2)]));
    exp.deliveries += 1;
    check(
        &engine,
        &exp,
        finished,
        "expiry of a cancelled lease, redelivery",
    );

    // Two more tasks due now: one to nack twice (a dead letter by nack), one to leave
    // unanswered (a retry by lease expiry). s2 stays unanswered on its last attempt (a dead
    // letter by lease expiry).
    engine.schedule(b"dl-nack", secs(0), b"p")?;
    engine.schedule(b"expire", secs(0), b"p")?;
    exp.scheduled += 2;
    let third = drain(&engine)?;
    assert_eq!(got(&third), want(&[("dl-nack", 1), ("expire", 1)]));
    exp.deliveries += 2;
    assert!(matches!(
        consumer.nack(of(&third, "dl-nack")?, None, "failed")?,
        NackOutcome::Retry { .. }
    ));
    exp.nacks += 1;
    exp.retries += 1;
    check(&engine, &exp, finished, "third deliveries");
    let fourth = advance(&clock, &engine, 1100)?;
    // s2: last attempt, dead; expire: attempt 1 of 2, retried.
    exp.lease_expiries += 2;
    exp.dead_lettered += 1;
    exp.retries += 1;
    assert_eq!(got(&fourth), want(&[("dl-nack", 2)]));
    exp.deliveries += 1;
    check(
        &engine,
        &exp,
        finished,
        "lease expiries (retry, dead letter)",
    );
    assert_eq!(
        consumer.nack(&fourth[0], None, "failed again")?,
        NackOutcome::DeadLettered
    );
    exp.nacks += 1;
    exp.dead_lettered += 1;
    check(&engine, &exp, finished, "nack into a dead letter");
    // s2 is a dead letter now: neither of its deliveries is outstanding.
    assert!(matches!(
        consumer.ack(s2),
        Err(AckError::NotOutstanding { .. })
    ));
    let second_s2 = of(&second, "s2")?;
    assert!(matches!(
        consumer.ack(second_s2),
        Err(AckError::NotOutstanding { .. })
    ));
    check(&engine, &exp, finished, "acks refused after the end");

    // Dead letters: a requeue is a new task; a purge counts; a failed requeue or purge
    // counts nothing.
    let dead = engine.dead_letters();
    assert_eq!(dead.len(), 2);
    engine.requeue_dead_letter(dead[0].task_id, secs(10))?;
    exp.scheduled += 1;
    exp.requeued += 1;
    check(&engine, &exp, finished, "requeue");
    assert!(engine.purge_dead_letter(dead[1].task_id)?);
    exp.purged += 1;
    assert!(!engine.purge_dead_letter(dead[1].task_id)?);
    assert!(matches!(
        engine.requeue_dead_letter(dead[1].task_id, secs(10)),
        Err(ScheduleError::NotDeadLetter { .. })
    ));
    check(&engine, &exp, finished, "requeue and purge");

    // A task waiting for its retry is cancelled: `Cancelled` after one delivery.
    assert_eq!(
        engine.cancel(b"expire")?,
        CancelOutcome::Cancelled { deliveries: 1 }
    );
    exp.cancelled += 1;
    check(&engine, &exp, finished, "cancel of a retry");

    // The levels agree with what is left: `up` (due at 6 s) and the requeued s2.
    let s = engine.stats();
    assert_eq!(
        (s.pending, s.scheduled, s.in_flight, s.dead_letters),
        (2, 2, 0, 0)
    );

    // Every total once more, spelled out: a slip in the bookkeeping above cannot hide one.
    assert_eq!(
        exp,
        Totals {
            scheduled: 15,
            rescheduled: 2,
            cancelled: 5,
            deliveries: 11,
            acks: 4,
            nacks: 4,
            lease_expiries: 3,
            retries: 3,
            dead_lettered: 2,
            requeued: 1,
            purged: 1,
        }
    );

    // The totals stay as they were once the engine has stopped.
    let before = engine.stats();
    engine.shutdown()?;
    assert_eq!(engine.stats(), before);
    Ok(())
}

#[test]
fn at_most_once_receipts_are_deliveries_and_nothing_else() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let mut c = cfg();
    c.delivery = DeliveryGuarantee::AtMostOnce;
    let engine = Engine::in_memory(c, Arc::new(clock.clone()))?;
    let consumer = engine.consumer();
    for i in 0..3 {
        engine.schedule(format!("k{i}").as_bytes(), secs(1), b"p")?;
    }
    let ds = advance(&clock, &engine, 1000)?;
    assert_eq!(ds.len(), 3);
    // Finished when received: the ack does nothing, the nack is refused, the key is free.
    consumer.ack(&ds[0])?;
    engine.ack_many(&ds[1..])?;
    assert!(matches!(
        consumer.nack(&ds[2], None, "x"),
        Err(AckError::NotOutstanding { .. })
    ));
    assert_eq!(engine.cancel(b"k0")?, NF);
    // Nothing expires either.
    assert!(advance(&clock, &engine, 5000)?.is_empty());
    let exp = Totals {
        scheduled: 3,
        deliveries: 3,
        ..Totals::default()
    };
    check(&engine, &exp, 0, "at most once");
    let s = engine.stats();
    assert_eq!((s.in_flight, s.pending), (0, 0));
    engine.shutdown()?;
    Ok(())
}

#[test]
fn a_reopened_engine_starts_every_total_at_zero() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(dir.path(), far_cfg(), &clock)?;
    check(&engine, &Totals::default(), 0, "first open");

    // Three far tasks (beyond the one-hour horizon: far once a checkpoint runs), two near.
    for i in 0..3 {
        engine.schedule(&far_key(i), far_at(far_due(i)), b"far")?;
    }
    engine.schedule(b"n0", secs(1), b"near")?;
    engine.schedule(b"n1", secs(1), b"near")?;
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 3);
    let mut exp = Totals {
        scheduled: 5,
        ..Totals::default()
    };
    check(&engine, &exp, 0, "schedules");
    // Far tasks are cancelled (one and in a batch) and rescheduled like any other.
    assert_eq!(engine.cancel(&far_key(0))?, C0);
    assert_eq!(engine.cancel_many(&[&far_key(1), b"absent"])?, vec![C0, NF]);
    exp.cancelled += 2;
    assert!(matches!(
        engine.reschedule(&far_key(2), far_at(far_due(2) + 60_000), None)?,
        RescheduleOutcome::Rescheduled(_)
    ));
    exp.rescheduled += 1;
    check(&engine, &exp, 0, "far cancels and reschedule");

    let ds = advance(&clock, &engine, 1000)?;
    assert_eq!(got(&ds), want(&[("n0", 1), ("n1", 1)]));
    exp.deliveries += 2;
    engine.ack(of(&ds, "n0")?)?;
    exp.acks += 1;
    check(&engine, &exp, 0, "deliveries");
    // n1 is still held at the shutdown: redelivered after the reopen.
    engine.shutdown()?;
    check(&engine, &exp, 0, "shutdown");
    drop(engine);

    let engine = open_fs(dir.path(), far_cfg(), &clock)?;
    let r = engine.recovery();
    assert_eq!((r.pending, r.redelivered), (2, 1));
    check(
        &engine,
        &Totals::default(),
        0,
        "reopen after a clean shutdown",
    );
    let ds = drain(&engine)?;
    assert_eq!(got(&ds), want(&[("n1", 2)]));
    let exp = Totals {
        deliveries: 1,
        ..Totals::default()
    };
    check(&engine, &exp, 0, "redelivery after the reopen");
    engine.schedule(b"n2", secs(1), b"near")?;
    // A crash: dropped without a shutdown.
    drop(engine);

    let engine = open_fs(dir.path(), far_cfg(), &clock)?;
    let r = engine.recovery();
    assert_eq!((r.pending, r.redelivered), (3, 1));
    check(&engine, &Totals::default(), 0, "reopen after a crash");
    engine.shutdown()?;
    Ok(())
}

/// `ack_and_schedule` counts one ack and one scheduled task; on a task cancelled while held,
/// the ack only; refused, nothing. The relations hold after each step.
#[test]
fn ack_and_schedule_counts_an_ack_and_a_new_task() -> TestResult {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(cfg(), Arc::new(clock.clone()))?;
    let consumer = engine.consumer();
    let mut exp = Totals::default();
    for k in ["a", "b"] {
        engine.schedule(k.as_bytes(), secs(1), b"p")?;
        exp.scheduled += 1;
    }
    let ds = advance(&clock, &engine, 1_000)?;
    exp.deliveries += 2;
    check(&engine, &exp, 0, "two deliveries");
    let (a, b) = (of(&ds, "a")?, of(&ds, "b")?);
    assert!(matches!(
        consumer.ack_and_schedule(
            a,
            secs(1),
            &vec![0; kairos::config::PAYLOAD_BYTES_MAX_DEFAULT + 1]
        ),
        Err(AckScheduleError::Schedule(_))
    ));
    check(&engine, &exp, 0, "a refused ack_and_schedule");
    assert!(matches!(
        consumer.ack_and_schedule(a, secs(1), b"next")?,
        AckScheduleOutcome::Scheduled(_)
    ));
    exp.acks += 1;
    exp.scheduled += 1;
    check(&engine, &exp, 0, "ack_and_schedule");
    assert_eq!(
        engine.cancel(b"b")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    assert_eq!(
        consumer.ack_and_schedule(b, secs(1), b"next")?,
        AckScheduleOutcome::CancelledWhileHeld
    );
    exp.acks += 1;
    check(
        &engine,
        &exp,
        0,
        "ack_and_schedule of a task cancelled while held",
    );
    assert!(matches!(
        consumer.ack_and_schedule(a, secs(1), b"again"),
        Err(AckScheduleError::Ack(AckError::NotOutstanding { .. }))
    ));
    let next = advance(&clock, &engine, 1_000)?;
    assert_eq!(got(&next), want(&[("a", 1)]));
    exp.deliveries += 1;
    check(&engine, &exp, 0, "the next run delivered");
    engine.shutdown()?;
    Ok(())
}

/// Dead letters the open found — one made by the open itself, a task held at the shutdown on
/// its last attempt — count in `Recovery::dead_letters`, so that the relation between the
/// level and the totals holds from the open on, through a requeue and a purge.
#[test]
fn dead_letters_found_at_open_keep_the_relation() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let mut c = cfg();
    c.retry.max_attempts = 1;
    let engine = open_fs(dir.path(), c.clone(), &clock)?;
    engine.schedule(b"nacked", secs(1), b"p")?;
    engine.schedule(b"held", secs(1), b"p")?;
    let ds = advance(&clock, &engine, 1000)?;
    assert_eq!(
        engine.consumer().nack(of(&ds, "nacked")?, None, "x")?,
        NackOutcome::DeadLettered
    );
    let exp = Totals {
        scheduled: 2,
        deliveries: 2,
        nacks: 1,
        dead_lettered: 1,
        ..Totals::default()
    };
    check(&engine, &exp, 0, "a nack into a dead letter");
    engine.shutdown()?;
    drop(engine);

    let engine = open_fs(dir.path(), c, &clock)?;
    let r = engine.recovery();
    assert_eq!((r.dead_lettered, r.dead_letters, r.pending), (1, 2, 0));
    let mut exp = Totals::default();
    check(&engine, &exp, 0, "reopen");
    let dead = engine.dead_letters();
    engine.requeue_dead_letter(dead[0].task_id, secs(1))?;
    exp.scheduled += 1;
    exp.requeued += 1;
    check(&engine, &exp, 0, "requeue");
    assert!(engine.purge_dead_letter(dead[1].task_id)?);
    exp.purged += 1;
    check(&engine, &exp, 0, "purge");
    assert_eq!(engine.stats().dead_letters, 0);
    engine.shutdown()?;
    Ok(())
}
