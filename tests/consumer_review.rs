//! The consumer side under concurrency and shutdown: real consumer threads receiving, acking,
//! nacking, extending and dropping deliveries while a manual clock moves and the engine is shut
//! down or crashed under them; blocked receives when the engine stops or is poisoned; exact
//! answers of acks, nacks and extensions around lease ends.
//!
//! Time moves only when a test moves it. Consumer threads wait with `recv_timeout` only to
//! notice that the engine stopped; no assertion depends on real time.

mod common;

use common::{config, drain, SimHarness, Stop, TestResult};
use kairos::{
    AckError, CancelOutcome, Config, Delivery, Durability, Engine, NackOutcome, RecvError,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A small deterministic generator (splitmix64) for the consumers' choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Sync durability, a short lease, three attempts, a short fixed backoff.
fn cfg() -> Config {
    let mut c = config(Durability::Sync);
    c.lease = ms(40);
    c.retry.max_attempts = 3;
    c.retry.backoff_initial = ms(5);
    c.retry.backoff_multiplier = 2;
    c.retry.backoff_max = ms(20);
    c.retry.backoff_jitter_percent = 0;
    c
}

/// What the consumer threads saw, in the order they recorded it.
#[derive(Debug, Clone)]
enum Event {
    Received {
        incarnation: usize,
        id: u64,
        attempt: u32,
    },
    Acked {
        id: u64,
        attempt: u32,
    },
    DeadLettered {
        id: u64,
    },
    /// A cancel answered: no attempt above `attempts` may be received.
    Cancelled {
        id: u64,
        attempts: u32,
    },
}

/// One consumer thread: receives until the engine stops, and does with each delivery what
/// the generator says. Any answer that only a bug (or an I/O fault, and there is none) can
/// give is returned as an error.
fn consume(
    consumer: kairos::Consumer,
    incarnation: usize,
    seed: u64,
    events: &Mutex<Vec<Event>>,
) -> TestResult {
    let mut rng = Rng(seed);
    let mut held: Vec<Delivery> = Vec::new();
    loop {
        let d = match consumer.recv_timeout(ms(5)) {
            Ok(d) => d,
            Err(RecvError::Timeout) => {
                // Work on a delivery kept from earlier, if any.
                if let Some(d) = held.pop() {
                    act_late(&consumer, &d, &mut rng, events)?;
                }
                continue;
            }
            Err(RecvError::Closed) => return Ok(()),
            Err(e) => return Err(format!("recv: {e:?}").into()),
        };
        if !d.payload().starts_with(&[d.key(), b":"].concat()) {
            return Err(
                format!("{d:?}: payload {:?}", String::from_utf8_lossy(d.payload())).into(),
            );
        }
        events.lock().map_err(|_| "lock")?.push(Event::Received {
            incarnation,
            id: d.task_id().0,
            attempt: d.attempt(),
        });
        match rng.below(10) {
            0..=4 => ack(&consumer, &d, events)?,
            5 => {
                let retry = (rng.below(2) == 0).then(|| ms(rng.below(15)));
                nack(&consumer, &d, retry, events)?;
            }
            6 => match consumer.extend_lease(&d, ms(1 + rng.below(60))) {
                Ok(())
                | Err(AckError::LeaseExpired { .. })
                | Err(AckError::NotOutstanding { .. }) => held.push(d),
                Err(AckError::Closed) => return Ok(()),
                Err(e) => return Err(format!("extend: {e:?}").into()),
            },
            // Kept for later (acted on after some clock moves), or dropped: its lease runs out.
            7 | 8 => held.push(d),
            _ => {}
        }
    }
}

fn ack(consumer: &kairos::Consumer, d: &Delivery, events: &Mutex<Vec<Event>>) -> TestResult {
    match consumer.ack(d) {
        Ok(()) => {
            events.lock().map_err(|_| "lock")?.push(Event::Acked {
                id: d.task_id().0,
                attempt: d.attempt(),
            });
            Ok(())
        }
        Err(AckError::LeaseExpired { .. } | AckError::NotOutstanding { .. } | AckError::Closed) => {
            Ok(())
        }
        Err(e) => Err(format!("ack: {e:?}").into()),
    }
}

fn nack(
    consumer: &kairos::Consumer,
    d: &Delivery,
    retry: Option<Duration>,
    events: &Mutex<Vec<Event>>,
) -> TestResult {
    match consumer.nack(d, retry, "review") {
        Ok(NackOutcome::DeadLettered) => {
            events
                .lock()
                .map_err(|_| "lock")?
                .push(Event::DeadLettered { id: d.task_id().0 });
            Ok(())
        }
        Ok(NackOutcome::Retry { next_attempt, .. }) if next_attempt == d.attempt() + 1 => Ok(()),
        // Cancelled while held.
        Ok(NackOutcome::Finished) => Ok(()),
        Err(AckError::LeaseExpired { .. } | AckError::NotOutstanding { .. } | AckError::Closed) => {
            Ok(())
        }
        other => Err(format!("nack: {other:?}").into()),
    }
}

fn act_late(
    consumer: &kairos::Consumer,
    d: &Delivery,
    rng: &mut Rng,
    events: &Mutex<Vec<Event>>,
) -> TestResult {
    if rng.below(2) == 0 {
        ack(consumer, d, events)
    } else {
        nack(consumer, d, None, events)
    }
}

/// Checks the events of a whole run against the delivery contract; `dead` are the dead
/// letters at the end, `ids` every task scheduled.
fn check(
    events: &[Event],
    dead: &BTreeSet<u64>,
    ids: &BTreeSet<u64>,
    at_most_once: bool,
) -> TestResult {
    let mut received: BTreeSet<(usize, u64, u32)> = BTreeSet::new();
    let mut acked: BTreeMap<u64, u32> = BTreeMap::new();
    let mut attempts: BTreeMap<u64, Vec<(usize, u32)>> = BTreeMap::new();
    let mut nacked_dead: BTreeSet<u64> = BTreeSet::new();
    let mut cancelled: BTreeMap<u64, u32> = BTreeMap::new();
    for e in events {
        match *e {
            Event::Received {
                incarnation,
                id,
                attempt,
            } => {
                if !received.insert((incarnation, id, attempt)) {
                    return Err(format!(
                        "task {id} attempt {attempt} received twice in incarnation {incarnation}"
                    )
                    .into());
                }
                if let Some(a) = acked.get(&id) {
                    return Err(format!(
                        "task {id} received (attempt {attempt}) after its ack of attempt {a}"
                    )
                    .into());
                }
                if nacked_dead.contains(&id) {
                    return Err(format!("task {id} received after it was dead-lettered").into());
                }
                attempts.entry(id).or_default().push((incarnation, attempt));
            }
            Event::Acked { id, attempt } => {
                if let Some(a) = acked.insert(id, attempt) {
                    return Err(format!("task {id} acked twice (attempts {a}, {attempt})").into());
                }
            }
            Event::DeadLettered { id } => {
                nacked_dead.insert(id);
            }
            Event::Cancelled { id, attempts } => {
                cancelled.insert(id, attempts);
            }
        }
    }
    for e in events {
        if let Event::Received { id, attempt, .. } = *e {
            if let Some(&n) = cancelled.get(&id) {
                if attempt > n {
                    return Err(format!(
                        "task {id} received (attempt {attempt}) after a cancel that saw {n} attempts"
                    )
                    .into());
                }
            }
        }
    }
    for (id, seen) in &attempts {
        // Attempts never go back, and a later incarnation sees a later attempt than any
        // received before it (a lease held at the stop counts as an attempt).
        for w in seen.windows(2) {
            let ((i0, a0), (i1, a1)) = (w[0], w[1]);
            if i1 > i0 && a1 <= a0 {
                return Err(format!("task {id}: attempt {a1} after a restart follows {a0}").into());
            }
        }
    }
    if at_most_once {
        // Each task once, never again (not across a crash either), none lost.
        for id in ids.iter() {
            let n = attempts.get(id).map_or(0, Vec::len);
            if n > 1 || (n == 0 && !cancelled.contains_key(id)) {
                return Err(format!("at most once: task {id} received {n} times").into());
            }
        }
        return Ok(());
    }
    for id in ids.iter().filter(|id| !cancelled.contains_key(id)) {
        let done = acked.contains_key(id) as u8 + dead.contains(id) as u8;
        if done != 1 {
            return Err(format!(
                "task {id}: acked {:?}, dead letter {} (exactly one expected)",
                acked.get(id),
                dead.contains(id)
            )
            .into());
        }
    }
    Ok(())
}

/// What a run keeps across incarnations.
struct Run {
    /// The main thread also checkpoints, reschedules, cancels, pauses and resumes.
    chaos: bool,
    /// Every task scheduled.
    ids: BTreeSet<u64>,
    events: Arc<Mutex<Vec<Event>>>,
}

/// Clock moves per incarnation.
const STEPS: u64 = 20;

/// Runs consumers on the harness's engine while the clock moves [`STEPS`] times, then stops
/// the engine as `stop` says and joins them.
fn run_incarnation(
    h: &mut SimHarness,
    run: &mut Run,
    incarnation: usize,
    seed: u64,
    stop: Stop,
) -> TestResult {
    let Run { chaos, ids, events } = run;
    let chaos = *chaos;
    let mut rng = Rng(seed ^ 0xABCD);
    let consumers: Vec<_> = (0..4).map(|_| h.engine().consumer()).collect();
    std::thread::scope(|s| -> TestResult {
        let threads: Vec<_> = consumers
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let events = Arc::clone(events);
                s.spawn(move || consume(c, incarnation, seed.wrapping_add(i as u64), &events))
            })
            .collect();
        for _ in 0..STEPS {
            h.clock.advance(ms(1 + rng.below(25)));
            h.engine().run_until_idle();
            if chaos {
                main_thread_chaos(h.engine(), &mut rng, ids, events)?;
            }
            // Let the consumers at what was handed out before the clock moves again (a
            // real-time pause only shapes the interleaving; no assertion depends on it).
            std::thread::sleep(ms(rng.below(3)));
        }
        // Deliveries go on for the stop (a pause is not durable anyway).
        h.engine().resume_deliveries();
        let result = h.stop(stop);
        for t in threads {
            t.join().map_err(|_| "consumer panicked")??;
        }
        result
    })
}

/// What the main thread does besides moving the clock in a chaotic run: checkpoints (which
/// move payloads and far tasks to disk, so that receives read them back with the engine's lock
/// let go), reschedules with a new payload, cancels.
fn main_thread_chaos(
    e: &Engine,
    rng: &mut Rng,
    ids: &mut BTreeSet<u64>,
    events: &Mutex<Vec<Event>>,
) -> TestResult {
    let key = format!("k{}", rng.below(300));
    match rng.below(9) {
        0 | 1 => {
            e.checkpoint()?;
        }
        2 | 3 => {
            let payload = format!("{key}:{}", rng.next());
            let due = kairos::Due::After(ms(rng.below(200)));
            match e.reschedule(key.as_bytes(), due, Some(payload.as_bytes())) {
                Ok(kairos::RescheduleOutcome::Scheduled(id)) => {
                    ids.insert(id.0);
                }
                Ok(_) | Err(kairos::ScheduleError::InFlight { .. }) => {}
                Err(e) => return Err(format!("reschedule: {e:?}").into()),
            }
        }
        5 => e.pause_deliveries(),
        6 => e.resume_deliveries(),
        4 => {
            // Only this thread makes tasks: the one a cancel finds is the one looked up.
            let id = e.lookup(key.as_bytes())?.map(|info| info.id.0);
            match e.cancel(key.as_bytes())? {
                CancelOutcome::Cancelled { deliveries } => {
                    let id = id.ok_or("cancelled a task the lookup did not find")?;
                    events.lock().map_err(|_| "lock")?.push(Event::Cancelled {
                        id,
                        attempts: deliveries,
                    });
                }
                CancelOutcome::AlreadyDelivered { attempt } => {
                    let id = id.ok_or("cancelled a task the lookup did not find")?;
                    events.lock().map_err(|_| "lock")?.push(Event::Cancelled {
                        id,
                        attempts: attempt,
                    });
                }
                CancelOutcome::NotFound => {}
                other => return Err(format!("cancel: {other:?}").into()),
            }
        }
        _ => {}
    }
    Ok(())
}

/// Four consumer threads receive, ack, nack (with and without a delay), extend and drop
/// deliveries while the clock moves; the engine is shut down cleanly or crashed under them
/// twice, with leases held and consumers blocked in `recv`, and reopened. Every other seed the
/// main thread also checkpoints (payloads and far tasks go to disk, so receives read them back
/// with the lock let go), reschedules with new payloads, cancels, pauses and resumes; some
/// seeds run `Buffered`, some at most once. Across the whole run: no delivery (task and
/// attempt) is received twice in one incarnation; a payload is always its own task's; nothing
/// is received after an ack of it returned `Ok`, after a nack dead-lettered it, or (at a later
/// attempt) after a cancel answered; an attempt received after a restart is later than every
/// one received before; and in the end every task not cancelled was acked exactly once or is
/// a dead letter, never both, never neither — at most once, received exactly once.
#[test]
fn consumers_racing_acks_expiries_and_restarts_keep_the_delivery_contract() -> TestResult {
    // 16 seeds in CI; KAIROS_TEST_SCALE multiplies them.
    let seeds = common::scaled(16, 4_000) as u64;
    for seed in 1..=seeds {
        let stops = match seed % 4 {
            0 => [Stop::Clean, Stop::Clean],
            1 => [Stop::ProcessCrash, Stop::Clean],
            2 => [Stop::Clean, Stop::ProcessCrash],
            _ => [Stop::ProcessCrash, Stop::ProcessCrash],
        };
        let mut run = Run {
            chaos: seed % 2 == 0,
            ids: BTreeSet::new(),
            events: Arc::new(Mutex::new(Vec::new())),
        };
        let at_most_once = seed % 5 == 0;
        let mut c = cfg();
        if at_most_once {
            c.delivery = kairos::DeliveryGuarantee::AtMostOnce;
        }
        if seed % 3 == 0 {
            c.durability = Durability::Buffered;
        }
        if run.chaos {
            // Payloads due later than 30 ms from now and far tasks go to disk at each
            // checkpoint; the driver promotes far tasks (no prefetch thread), and a receive
            // reads a payload still on disk with the engine's lock let go.
            c.payload_window = Some(ms(30));
            c.resident_window = Some(ms(30));
            c.horizon = Some(Duration::from_secs(3_600));
        }
        let mut h = SimHarness::new(7_000 + seed, c)?;
        let mut rng = Rng(seed);
        for i in 0..300u64 {
            let key = format!("k{i}");
            let due = ms(1 + rng.below(400));
            let id =
                h.engine()
                    .schedule_after(key.as_bytes(), due, format!("{key}:").as_bytes())?;
            run.ids.insert(id.0);
        }
        for (incarnation, stop) in stops.into_iter().enumerate() {
            run_incarnation(
                &mut h,
                &mut run,
                incarnation,
                seed * 10 + incarnation as u64,
                stop,
            )?;
            h.start()?;
        }
        // The last incarnation with consumer threads, then one that runs until everything is
        // settled: acked or dead.
        run_incarnation(&mut h, &mut run, 2, seed * 10 + 2, Stop::Clean)?;
        h.start()?;
        let Run { ids, events, .. } = &run;
        let consumer = h.engine().consumer();
        for _ in 0..200 {
            if h.engine().stats().pending == 0 {
                break;
            }
            h.clock.advance(ms(50));
            for d in drain(h.engine())? {
                events.lock().map_err(|_| "lock")?.push(Event::Received {
                    incarnation: 3,
                    id: d.task_id().0,
                    attempt: d.attempt(),
                });
                ack(&consumer, &d, events)?;
            }
        }
        assert_eq!(h.engine().stats().pending, 0, "seed {seed}");
        let dead: BTreeSet<u64> = h
            .engine()
            .dead_letters()
            .iter()
            .map(|d| d.task_id.0)
            .collect();
        let events = events.lock().map_err(|_| "lock")?.clone();
        check(&events, &dead, ids, at_most_once).map_err(|e| format!("seed {seed}: {e}"))?;
    }
    Ok(())
}

/// `run_until_idle` right after a receive: the receive's lease timer wakes the driver, and
/// that pass may still be pending when `run_until_idle` returns (nothing is due). At an
/// unchanged clock it hands out nothing and logs nothing; after the next clock move
/// `run_until_idle` waits for a pass at the new reading (`Core::processed_ns`), so the lease
/// expiry is processed when it returns, however the two passes interleave. Repeated to give
/// the interleavings a chance.
#[test]
fn run_until_idle_after_a_receive_processes_the_lease_expiry_exactly() -> TestResult {
    let h = SimHarness::new(7_100, cfg())?;
    let e = h.engine();
    let consumer = e.consumer();
    for i in 0..300u64 {
        let key = format!("r{i}");
        let id = e.schedule_after(key.as_bytes(), ms(1), b"")?;
        h.clock.advance(ms(1));
        e.run_until_idle();
        let d = consumer.try_recv()?;
        assert_eq!((d.task_id(), d.attempt()), (id, 1));
        e.run_until_idle();
        assert_eq!((e.stats().in_flight, e.stats().scheduled), (1, 0));
        // One tick short of the lease's end: still held.
        h.clock.advance(ms(39));
        e.run_until_idle();
        assert_eq!((e.stats().in_flight, e.stats().scheduled), (1, 0), "{i}");
        h.clock.advance(ms(1));
        e.run_until_idle();
        assert_eq!((e.stats().in_flight, e.stats().scheduled), (0, 1), "{i}");
        assert!(matches!(
            consumer.ack(&d),
            Err(AckError::LeaseExpired { .. })
        ));
        // The backoff (5 ms, no jitter), then attempt 2.
        h.clock.advance(ms(4));
        assert!(drain(e)?.is_empty(), "{i}: early");
        h.clock.advance(ms(1));
        let again = drain(e)?;
        assert_eq!(
            again
                .iter()
                .map(|d| (d.task_id(), d.attempt()))
                .collect::<Vec<_>>(),
            [(id, 2)],
            "{i}"
        );
        consumer.ack(&again[0])?;
    }
    assert_eq!(e.stats().pending, 0);
    Ok(())
}

/// Consumers blocked in `recv`, `recv_timeout` and the iterator when a delivery pass's
/// fdatasync fails: each returns `Poisoned` (the iterator ends) instead of waiting for ever;
/// `run_until_idle` returns; a lease held across the failure answers `Poisoned` to its ack,
/// nack and extension; the shutdown reports the failure; after a reopen the held task comes
/// again as attempt 2 and the one whose hand-out failed as attempt 1 or 2 (its deliver record
/// may or may not have reached the disk), each exactly once.
#[test]
fn consumers_blocked_when_a_delivery_sync_fails_return_poisoned() -> TestResult {
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan};
    let mut h = SimHarness::new(7_101, cfg())?;
    let held_id = h.engine().schedule_after(b"held", ms(1), b"held:")?;
    let lost_id = h.engine().schedule_after(b"lost", ms(10), b"lost:")?;
    h.clock.advance(ms(1));
    let held = common::drain(h.engine())?;
    assert_eq!(held.len(), 1);
    let held = held.into_iter().next().ok_or("held")?;
    let consumer = h.engine().consumer();
    let answers = std::thread::scope(|s| -> TestResult<Vec<String>> {
        let c = &consumer;
        let waiting = [
            s.spawn(move || format!("{:?}", c.recv().map(|d| d.task_id()))),
            s.spawn(move || {
                format!(
                    "{:?}",
                    c.recv_timeout(Duration::from_secs(3_600))
                        .map(|d| d.task_id())
                )
            }),
            s.spawn(move || format!("iter {}", c.iter().count())),
        ];
        // Let them block (not needed for the outcome: a consumer that comes late finds the
        // engine poisoned all the same).
        std::thread::sleep(ms(20));
        h.sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        h.clock.advance(ms(9));
        h.engine().run_until_idle();
        waiting
            .into_iter()
            .map(|w| w.join().map_err(|_| "consumer panicked".into()))
            .collect()
    })?;
    h.sim.clear_faults();
    assert_eq!(answers.len(), 3);
    for a in &answers[..2] {
        assert!(a.starts_with("Err(Poisoned"), "{a}");
    }
    assert_eq!(answers[2], "iter 0");
    let e = h.engine();
    assert!(matches!(e.ack(&held), Err(AckError::Poisoned { .. })));
    assert!(matches!(
        e.nack(&held, None, "x"),
        Err(AckError::Poisoned { .. })
    ));
    assert!(matches!(
        e.extend_lease(&held, ms(100)),
        Err(AckError::Poisoned { .. })
    ));
    assert!(matches!(
        consumer.try_recv(),
        Err(RecvError::Poisoned { .. })
    ));
    assert!(e.shutdown().is_err());
    // Not taken back by the shutdown of a poisoned engine: the count it had (the delivery
    // whose record did not sync).
    assert_eq!(consumer.ready(), 1);
    // After the shutdown, still the poisoning (not `Closed`).
    assert!(matches!(
        consumer.try_recv(),
        Err(RecvError::Poisoned { .. })
    ));
    h.restart(Stop::ProcessCrash)?;
    let again = common::drain(h.engine())?;
    let got: Vec<(u64, u32)> = again.iter().map(|d| (d.task_id().0, d.attempt())).collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.contains(&(held_id.0, 2)), "{got:?}");
    assert!(
        got.contains(&(lost_id.0, 1)) || got.contains(&(lost_id.0, 2)),
        "{got:?}"
    );
    h.engine().ack_many(&again)?;
    h.clock.advance(Duration::from_secs(3_600));
    assert!(common::drain(h.engine())?.is_empty());
    Ok(())
}

/// After a clean shutdown every consumer call answers `Closed` — receives, acks, nacks and
/// extensions of a lease still held, the iterator ends — and `Consumer::ready` is 0; a task
/// cancelled while held is gone after the reopen, not redelivered and not a dead letter.
#[test]
fn after_a_shutdown_every_consumer_call_is_closed() -> TestResult {
    let mut h = SimHarness::new(7_102, cfg())?;
    let e = h.engine();
    for k in ["a", "b", "c"] {
        e.schedule_after(k.as_bytes(), ms(1), format!("{k}:").as_bytes())?;
    }
    h.clock.advance(ms(1));
    e.run_until_idle();
    let consumer = e.consumer();
    let a = consumer.try_recv()?;
    let b = consumer.try_recv()?;
    assert_eq!(
        e.cancel(b.key())?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    // c stays in the ready queue.
    assert_eq!(consumer.ready(), 1);
    e.shutdown()?;
    assert_eq!(consumer.ready(), 0);
    assert!(matches!(consumer.try_recv(), Err(RecvError::Closed)));
    assert!(matches!(consumer.recv(), Err(RecvError::Closed)));
    assert!(matches!(
        consumer.recv_timeout(ms(1)),
        Err(RecvError::Closed)
    ));
    assert_eq!(consumer.iter().count(), 0);
    for d in [&a, &b] {
        assert!(matches!(consumer.ack(d), Err(AckError::Closed)), "{d:?}");
        assert!(matches!(
            consumer.ack_many(std::slice::from_ref(d)),
            Err(AckError::Closed)
        ));
        assert!(matches!(consumer.nack(d, None, "x"), Err(AckError::Closed)));
        assert!(matches!(
            consumer.extend_lease(d, ms(5)),
            Err(AckError::Closed)
        ));
    }
    assert!(matches!(consumer.ack_many(&[]), Err(AckError::Closed)));
    h.restart(Stop::Clean)?;
    let r = h.engine().recovery().clone();
    assert_eq!(
        (r.redelivered, r.dead_lettered, r.pending),
        (1, 0, 2),
        "{r:?}"
    );
    let again = common::drain(h.engine())?;
    let got: Vec<(&[u8], u32)> = again.iter().map(|d| (d.key(), d.attempt())).collect();
    assert_eq!(got, [(&b"a"[..], 2), (&b"c"[..], 1)]);
    assert!(h.engine().dead_letters().is_empty());
    Ok(())
}

/// What an ack, a nack and a lease extension of a delivery whose attempt is over answer, for
/// each way it can be over: `LeaseExpired` while the task lives on for another attempt,
/// `NotOutstanding` once it is finished — the three calls always agree, change nothing, and
/// answer the same whether or not the driver has processed the lease's end yet.
#[test]
fn calls_on_a_delivery_whose_attempt_is_over_agree() -> TestResult {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Over {
        /// Its lease ran out, not yet processed; attempts left.
        ExpiredUnprocessed,
        /// Its lease ran out on the last attempt, not yet processed.
        ExpiredLastUnprocessed,
        /// Cancelled while held, then its lease ran out.
        AbandonedExpired,
        /// Nacked on its last attempt: a dead letter.
        NackedDead,
        /// Redelivered to another consumer after a nack.
        HeldByAnother,
        /// Redelivered and acked by another consumer.
        AckedByAnother,
        /// Waiting for its retry, then cancelled.
        CancelledBeforeRetry,
        /// A dead letter requeued as a new task.
        Requeued,
    }
    use Over::*;
    for (n, over) in [
        ExpiredUnprocessed,
        ExpiredLastUnprocessed,
        AbandonedExpired,
        NackedDead,
        HeldByAnother,
        AckedByAnother,
        CancelledBeforeRetry,
        Requeued,
    ]
    .into_iter()
    .enumerate()
    {
        let h = SimHarness::new(7_200 + n as u64, cfg())?;
        let e = h.engine();
        let c = e.consumer();
        e.schedule_after(b"k", ms(1), b"k:")?;
        // Attempts used before the one under test: 2 of 3 for the last-attempt cases.
        let before = match over {
            ExpiredLastUnprocessed | NackedDead | Requeued => 2,
            _ => 0,
        };
        h.clock.advance(ms(1));
        e.run_until_idle();
        let mut d = c.try_recv()?;
        for _ in 0..before {
            c.nack(&d, Some(Duration::ZERO), "again")?;
            e.run_until_idle();
            d = c.try_recv()?;
        }
        assert_eq!(d.attempt(), before + 1);
        let finished = match over {
            ExpiredUnprocessed | ExpiredLastUnprocessed => {
                // The lease's end, with the driver kept from processing it.
                e.pause_deliveries();
                e.run_until_idle();
                h.clock.advance(ms(40));
                over == ExpiredLastUnprocessed
            }
            AbandonedExpired => {
                assert_eq!(
                    e.cancel(b"k")?,
                    CancelOutcome::AlreadyDelivered { attempt: 1 }
                );
                h.clock.advance(ms(40));
                e.run_until_idle();
                true
            }
            NackedDead => {
                assert_eq!(c.nack(&d, None, "no")?, NackOutcome::DeadLettered);
                true
            }
            HeldByAnother | AckedByAnother => {
                c.nack(&d, Some(Duration::ZERO), "again")?;
                e.run_until_idle();
                let other = c.try_recv()?;
                assert_eq!(other.attempt(), 2);
                if over == AckedByAnother {
                    c.ack(&other)?;
                }
                over == AckedByAnother
            }
            CancelledBeforeRetry => {
                c.nack(&d, Some(ms(10)), "later")?;
                assert_eq!(e.cancel(b"k")?, CancelOutcome::Cancelled { deliveries: 1 });
                true
            }
            Requeued => {
                assert_eq!(c.nack(&d, None, "no")?, NackOutcome::DeadLettered);
                e.requeue_dead_letter(d.task_id(), kairos::Due::After(ms(0)))?;
                e.run_until_idle();
                let fresh = c.try_recv()?;
                assert_eq!((fresh.key(), fresh.attempt()), (&b"k"[..], 1));
                true
            }
        };
        let stats = e.stats();
        let answers = [
            format!("{:?}", c.ack(&d)),
            format!("{:?}", c.ack_many(std::slice::from_ref(&d))),
            format!("{:?}", c.nack(&d, None, "late").map(|_| ())),
            format!("{:?}", c.extend_lease(&d, ms(100))),
        ];
        let want = if finished {
            format!("Err(NotOutstanding {{ task_id: {} }})", d.task_id().0)
        } else {
            format!("Err(LeaseExpired {{ task_id: {} }})", d.task_id().0)
        };
        for a in &answers {
            assert_eq!(a, &want, "{over:?}");
        }
        assert_eq!(
            e.stats(),
            stats,
            "{over:?}: a refused call changed something"
        );
    }
    Ok(())
}

/// Two shutdowns racing a checkpoint and each other, with the background threads on (the
/// checkpointer, wanting a checkpoint at every record, and the prefetcher): every call
/// returns, the checkpoint `Ok` or `Closed`, and the log is closed cleanly, the deliveries held
/// at the stop coming again after the reopen.
#[test]
fn shutdowns_racing_a_checkpoint_and_each_other_stop_cleanly() -> TestResult {
    for seed in 0..30u64 {
        let mut c = cfg();
        c.payload_prefetch = true;
        c.checkpoint_log_bytes = Some(1);
        c.payload_window = Some(ms(30));
        c.resident_window = Some(ms(30));
        let mut h = SimHarness::new(7_300 + seed, c)?;
        for i in 0..200u64 {
            h.engine()
                .schedule_after(format!("k{i}").as_bytes(), ms(1 + i * 3), b"k:")?;
        }
        h.clock.advance(ms(50));
        let got = drain(h.engine())?;
        {
            let e = h.engine();
            let answers = std::thread::scope(|s| {
                let cp = s.spawn(|| format!("{:?}", e.checkpoint().map(|_| ())));
                let a = s.spawn(|| format!("{:?}", e.shutdown()));
                let b = s.spawn(|| format!("{:?}", e.shutdown()));
                [cp.join(), a.join(), b.join()]
            });
            for a in answers {
                let a = a.map_err(|_| "panicked")?;
                assert!(a == "Ok(())" || a == "Err(Closed)", "{a}");
            }
        }
        h.stop(Stop::Clean)?;
        h.start()?;
        assert!(h.engine().recovery().wal.clean_shutdown);
        assert_eq!(h.engine().recovery().redelivered, got.len());
    }
    Ok(())
}
