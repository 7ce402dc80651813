//! Cancel racing delivery, lease expiry, ack and nack from many threads, on tasks all due at the
//! same instant, with a short lease and fast retries so every path is taken: consumers ack at
//! once, nack at once, hold a delivery past its lease and then ack or nack it, or never answer;
//! cancellers cancel tasks at random moments around the deadline (some twice). Every thread
//! logs what each call answered, after it returned.
//!
//! In process, the race runs to the end and every task must have exactly one consistent
//! outcome (cancelled while waiting, cancelled while held, acked, or dead-lettered), checked
//! against the logs and against the write-ahead log; then a power cut and a reopen change
//! nothing. Out of process, a child runs the race on a real directory and is SIGKILLed at a
//! random moment (the pattern of `tests/crash.rs`); the parent reopens the directory and checks
//! that every answer a thread observed still holds and that every other task is either
//! delivered again (with a higher attempt) or dead-lettered, with at most one task per thread
//! finished by a call in flight at the kill.

mod common;

use common::child::ChildProc;
use common::{drain, scaled, SimHarness, SplitMix, Stop, TestResult, START_MS};
use kairos::clock::ms_to_system_time;
use kairos::record::{Record, RECORD_ACK, RECORD_CANCEL, RECORD_DEAD, RECORD_DELIVER};
use kairos::{
    AckError, CancelOutcome, Config, Delivery, Due, Durability, Engine, ManualClock, NackOutcome,
    NewTask, RecvError,
};
use kairos_wal::FsStorage;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const CONSUMERS: usize = 4;
const CANCELLERS: usize = 3;
/// Every task is due this long after [`START_MS`].
const DUE_MS: u64 = 10;
const LEASE_MS: u64 = 20;
const MAX_ATTEMPTS: u32 = 3;
/// Real time after which a stuck race fails instead of hanging.
const HANG: Duration = Duration::from_secs(120);

/// Lease 20 ms, 3 attempts, backoff 5 ms, 10 ms (no jitter): a task lives through all its
/// attempts within about 100 ms of manual time.
fn race_config(durability: Durability) -> Config {
    let mut c = Config::default();
    c.durability = durability;
    c.segment_bytes = common::SMALL_SEGMENT_BYTES;
    c.lease = ms(LEASE_MS);
    c.retry.max_attempts = MAX_ATTEMPTS;
    c.retry.backoff_initial = ms(5);
    c.retry.backoff_multiplier = 2;
    c.retry.backoff_max = ms(50);
    c.retry.backoff_jitter_percent = 0;
    c
}

fn task_key(i: usize) -> Vec<u8> {
    format!("t{i}").into_bytes()
}

fn task_of(key: &[u8]) -> TestResult<usize> {
    let s = std::str::from_utf8(key)?;
    Ok(s.strip_prefix('t').ok_or("foreign key")?.parse()?)
}

fn nack_text(task: usize, attempt: u32) -> String {
    format!("nack of t{task} attempt {attempt}")
}

fn lease_error() -> String {
    format!("lease expired without ack or nack (Config::lease is {LEASE_MS} ms)")
}

/// What a call answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    Expired,
    NotOutstanding,
    Retry(u32),
    Dead,
    Finished,
    Cancelled(u32),
    Delivered(u32),
    NotFound,
}

/// One call a thread made and what it answered, reported after the call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Recv {
        task: usize,
        attempt: u32,
    },
    Ack {
        task: usize,
        attempt: u32,
        answer: Answer,
    },
    Nack {
        task: usize,
        attempt: u32,
        answer: Answer,
    },
    Cancel {
        task: usize,
        answer: Answer,
    },
}

impl Event {
    fn task(&self) -> usize {
        match *self {
            Event::Recv { task, .. }
            | Event::Ack { task, .. }
            | Event::Nack { task, .. }
            | Event::Cancel { task, .. } => task,
        }
    }

    /// `kind task attempt answer arg`, for the child's protocol.
    fn to_line(self) -> String {
        let (kind, task, attempt, answer) = match self {
            Event::Recv { task, attempt } => ("recv", task, attempt, Answer::Ok),
            Event::Ack {
                task,
                attempt,
                answer,
            } => ("ack", task, attempt, answer),
            Event::Nack {
                task,
                attempt,
                answer,
            } => ("nack", task, attempt, answer),
            Event::Cancel { task, answer } => ("cancel", task, 0, answer),
        };
        let (a, arg) = match answer {
            Answer::Ok => ("ok", 0),
            Answer::Expired => ("expired", 0),
            Answer::NotOutstanding => ("notout", 0),
            Answer::Retry(n) => ("retry", n),
            Answer::Dead => ("dead", 0),
            Answer::Finished => ("finished", 0),
            Answer::Cancelled(n) => ("cancelled", n),
            Answer::Delivered(n) => ("delivered", n),
            Answer::NotFound => ("notfound", 0),
        };
        format!("{kind} {task} {attempt} {a} {arg}")
    }

    fn parse(line: &str) -> TestResult<Event> {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, task, attempt, a, arg] = f[..] else {
            return Err(format!("bad event line {line:?}").into());
        };
        let (task, attempt, arg): (usize, u32, u32) =
            (task.parse()?, attempt.parse()?, arg.parse()?);
        let answer = match a {
            "ok" => Answer::Ok,
            "expired" => Answer::Expired,
            "notout" => Answer::NotOutstanding,
            "retry" => Answer::Retry(arg),
            "dead" => Answer::Dead,
            "finished" => Answer::Finished,
            "cancelled" => Answer::Cancelled(arg),
            "delivered" => Answer::Delivered(arg),
            "notfound" => Answer::NotFound,
            _ => return Err(format!("bad answer in {line:?}").into()),
        };
        Ok(match kind {
            "recv" => Event::Recv { task, attempt },
            "ack" => Event::Ack {
                task,
                attempt,
                answer,
            },
            "nack" => Event::Nack {
                task,
                attempt,
                answer,
            },
            "cancel" => Event::Cancel { task, answer },
            _ => return Err(format!("bad kind in {line:?}").into()),
        })
    }
}

fn ack_answer(r: Result<(), AckError>) -> TestResult<Answer> {
    match r {
        Ok(()) => Ok(Answer::Ok),
        Err(AckError::LeaseExpired { .. }) => Ok(Answer::Expired),
        Err(AckError::NotOutstanding { .. }) => Ok(Answer::NotOutstanding),
        Err(e) => Err(e.into()),
    }
}

fn nack_answer(r: Result<NackOutcome, AckError>) -> TestResult<Answer> {
    match r {
        Ok(NackOutcome::Retry { next_attempt, .. }) => Ok(Answer::Retry(next_attempt)),
        Ok(NackOutcome::DeadLettered) => Ok(Answer::Dead),
        Ok(NackOutcome::Finished) => Ok(Answer::Finished),
        Ok(other) => Err(format!("nack: {other:?}").into()),
        Err(AckError::LeaseExpired { .. }) => Ok(Answer::Expired),
        Err(AckError::NotOutstanding { .. }) => Ok(Answer::NotOutstanding),
        Err(e) => Err(e.into()),
    }
}

fn cancel_answer(o: CancelOutcome) -> TestResult<Answer> {
    match o {
        CancelOutcome::Cancelled { deliveries } => Ok(Answer::Cancelled(deliveries)),
        CancelOutcome::AlreadyDelivered { attempt } => Ok(Answer::Delivered(attempt)),
        CancelOutcome::NotFound => Ok(Answer::NotFound),
        other => Err(format!("cancel: {other:?}").into()),
    }
}

/// Schedules `n` tasks, all due at `START_MS + DUE_MS`.
fn schedule_race(engine: &Engine, n: usize) -> TestResult {
    let keys: Vec<Vec<u8>> = (0..n).map(task_key).collect();
    let due = Due::At(ms_to_system_time(START_MS + DUE_MS));
    for chunk in keys.chunks(10_000) {
        let batch: Vec<NewTask<'_>> = chunk
            .iter()
            .map(|k| NewTask {
                key: k,
                due,
                payload: k,
            })
            .collect();
        engine.schedule_many(&batch)?;
    }
    Ok(())
}

/// What a consumer does with a delivery.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Ack,
    Nack,
    /// Never answers: the lease runs out.
    Abandon,
}

/// Runs the race on `engine` (whose tasks `schedule_race` made), moving `clock` a millisecond
/// at a time until every task is settled. `emit(thread, event)` is called after each call
/// returns.
fn run_race(
    engine: &Engine,
    clock: &ManualClock,
    n: usize,
    seed: u64,
    emit: &(dyn Fn(usize, Event) -> TestResult + Sync),
) -> TestResult {
    let done = AtomicBool::new(false);
    let held = AtomicUsize::new(0);
    let cancellers_left = AtomicUsize::new(CANCELLERS);
    let give_up = Instant::now() + HANG;
    std::thread::scope(|s| -> TestResult {
        let mut threads = Vec::new();
        for c in 0..CONSUMERS {
            let (done, held) = (&done, &held);
            threads.push(s.spawn(move || -> TestResult {
                let mut rng = SplitMix(seed ^ (0xC0 + c as u64));
                let consumer = engine.consumer();
                // (manual time to act at, delivery, ack or nack)
                let mut holding: Vec<(u64, Delivery, Plan)> = Vec::new();
                let act = |d: &Delivery, plan: Plan| -> TestResult {
                    let (task, attempt) = (task_of(d.key())?, d.attempt());
                    match plan {
                        Plan::Ack => {
                            let answer = ack_answer(consumer.ack(d))?;
                            emit(
                                c,
                                Event::Ack {
                                    task,
                                    attempt,
                                    answer,
                                },
                            )
                        }
                        Plan::Nack => {
                            let text = nack_text(task, attempt);
                            let answer = nack_answer(consumer.nack(d, None, &text))?;
                            emit(
                                c,
                                Event::Nack {
                                    task,
                                    attempt,
                                    answer,
                                },
                            )
                        }
                        Plan::Abandon => Ok(()),
                    }
                };
                loop {
                    let now = clock.wall_ms();
                    let finishing = done.load(Ordering::Acquire);
                    let mut k = 0;
                    while k < holding.len() {
                        if holding[k].0 <= now || finishing {
                            let (_, d, plan) = holding.swap_remove(k);
                            act(&d, plan)?;
                            held.fetch_sub(1, Ordering::AcqRel);
                        } else {
                            k += 1;
                        }
                    }
                    match consumer.recv_timeout(ms(1)) {
                        Ok(d) => {
                            let (task, attempt) = (task_of(d.key())?, d.attempt());
                            emit(c, Event::Recv { task, attempt })?;
                            match rng.range(0, 99) {
                                0..=34 => act(&d, Plan::Ack)?,
                                35..=49 => act(&d, Plan::Nack)?,
                                50..=69 => {
                                    held.fetch_add(1, Ordering::AcqRel);
                                    holding.push((now + rng.range(0, 40), d, Plan::Ack));
                                }
                                70..=79 => {
                                    held.fetch_add(1, Ordering::AcqRel);
                                    holding.push((now + rng.range(0, 40), d, Plan::Nack));
                                }
                                _ => act(&d, Plan::Abandon)?,
                            }
                        }
                        Err(RecvError::Timeout) => {
                            if finishing && holding.is_empty() {
                                return Ok(());
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }));
        }
        for t in 0..CANCELLERS {
            let cancellers_left = &cancellers_left;
            threads.push(s.spawn(move || -> TestResult {
                let mut rng = SplitMix(seed ^ (0xCA + t as u64));
                let mut targets: Vec<(u64, usize)> = Vec::new();
                for i in 0..n {
                    if rng.chance(40) {
                        targets.push((START_MS + rng.range(DUE_MS - 2, DUE_MS + 80), i));
                    }
                }
                targets.sort_unstable();
                for (when, task) in targets {
                    while clock.wall_ms() < when {
                        if Instant::now() > give_up {
                            return Err("canceller: the clock stopped".into());
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    let answer = cancel_answer(engine.cancel(&task_key(task))?)?;
                    emit(CONSUMERS + t, Event::Cancel { task, answer })?;
                }
                cancellers_left.fetch_sub(1, Ordering::AcqRel);
                Ok(())
            }));
        }
        // The clock, a millisecond at a time, with a little real time for the others.
        let mut result = Ok(());
        loop {
            clock.advance(ms(1));
            engine.run_until_idle();
            std::thread::sleep(Duration::from_micros(100));
            if cancellers_left.load(Ordering::Acquire) == 0
                && held.load(Ordering::Acquire) == 0
                && engine.stats().pending == 0
            {
                break;
            }
            if Instant::now() > give_up {
                result = Err(format!("race did not settle: {:?}", engine.stats()).into());
                break;
            }
        }
        done.store(true, Ordering::Release);
        for t in threads {
            t.join().map_err(|_| "race thread panicked")??;
        }
        result
    })
}

/// Everything observed about one task.
#[derive(Debug, Default, Clone)]
struct Seen {
    recvs: Vec<u32>,
    acks: Vec<(u32, Answer)>,
    nacks: Vec<(u32, Answer)>,
    cancels: Vec<Answer>,
}

impl Seen {
    fn max_attempt(&self) -> u32 {
        self.recvs.iter().copied().max().unwrap_or(0)
    }
    /// The cancel that found the task live: `Cancelled(d)` or `Delivered(a)`.
    fn winning_cancel(&self) -> Option<Answer> {
        self.cancels
            .iter()
            .copied()
            .find(|a| *a != Answer::NotFound)
    }
    fn acked(&self) -> bool {
        self.acks.iter().any(|(_, a)| *a == Answer::Ok)
    }
    /// A call answered that the task is finished: a cancel found it live, an ack succeeded,
    /// or a nack said it was finished (cancelled while held).
    fn finished(&self) -> bool {
        self.winning_cancel().is_some()
            || self.acked()
            || self.nacks.iter().any(|(_, a)| *a == Answer::Finished)
    }
    fn nack_dead(&self) -> Option<u32> {
        self.nacks
            .iter()
            .find(|(_, a)| *a == Answer::Dead)
            .map(|(n, _)| *n)
    }
}

fn by_task(events: &[Event], n: usize) -> TestResult<Vec<Seen>> {
    let mut seen = vec![Seen::default(); n];
    for e in events {
        let s = seen
            .get_mut(e.task())
            .ok_or_else(|| format!("unknown task in {e:?}"))?;
        match *e {
            Event::Recv { attempt, .. } => s.recvs.push(attempt),
            Event::Ack {
                attempt, answer, ..
            } => s.acks.push((attempt, answer)),
            Event::Nack {
                attempt, answer, ..
            } => s.nacks.push((attempt, answer)),
            Event::Cancel { answer, .. } => s.cancels.push(answer),
        }
    }
    Ok(seen)
}

/// Checks that hold for any set of observations; `complete` if no call was cut short (a kill
/// may have kept a thread from reporting an answer that other answers depend on).
fn check_observed(i: usize, s: &Seen, complete: bool) -> TestResult {
    let mut attempts = s.recvs.clone();
    attempts.sort_unstable();
    attempts.dedup();
    if attempts.len() != s.recvs.len() {
        return Err(format!("t{i}: an attempt received twice: {s:?}").into());
    }
    if s.max_attempt() > MAX_ATTEMPTS {
        return Err(format!("t{i}: more than {MAX_ATTEMPTS} attempts: {s:?}").into());
    }
    if s.cancels.iter().filter(|a| **a != Answer::NotFound).count() > 1 {
        return Err(format!("t{i}: cancelled twice: {s:?}").into());
    }
    match s.winning_cancel() {
        Some(Answer::Cancelled(d)) if s.max_attempt() > d => {
            return Err(format!("t{i}: delivered after Cancelled: {s:?}").into())
        }
        Some(Answer::Delivered(a)) if s.max_attempt() > a => {
            return Err(format!("t{i}: redelivered after AlreadyDelivered: {s:?}").into())
        }
        _ => {}
    }
    for &(attempt, answer) in &s.acks {
        if answer == Answer::Ok && s.max_attempt() > attempt {
            return Err(format!("t{i}: delivered again after an ack: {s:?}").into());
        }
    }
    for &(attempt, answer) in &s.nacks {
        let ok = match answer {
            Answer::Retry(next) => next == attempt + 1 && attempt < MAX_ATTEMPTS,
            Answer::Dead => attempt == MAX_ATTEMPTS,
            // The cancel that abandoned the task may be the call a kill cut short.
            Answer::Finished => {
                s.winning_cancel() == Some(Answer::Delivered(attempt))
                    || (!complete && s.winning_cancel().is_none())
            }
            _ => true,
        };
        if !ok {
            return Err(
                format!("t{i}: nack of attempt {attempt} answered {answer:?}: {s:?}").into(),
            );
        }
    }
    Ok(())
}

/// The complete-run check: each task has exactly one outcome, and every answer agrees with it.
/// `dead` maps a task to its dead letter's (attempts, error).
fn check_complete(seen: &[Seen], dead: &BTreeMap<usize, (u32, String)>) -> TestResult<[usize; 4]> {
    let mut tally = [0usize; 4]; // cancelled waiting, cancelled held, acked, dead
    for (i, s) in seen.iter().enumerate() {
        check_observed(i, s, true)?;
        let k = s.max_attempt();
        if s.recvs.len() != k as usize {
            return Err(format!("t{i}: attempts received are not 1..={k}: {s:?}").into());
        }
        let cancel = s.winning_cancel();
        let d = dead.get(&i);
        let outcomes = [
            matches!(cancel, Some(Answer::Cancelled(_))),
            matches!(cancel, Some(Answer::Delivered(_))),
            s.acked() && !matches!(cancel, Some(Answer::Delivered(_))),
            d.is_some(),
        ];
        if outcomes.iter().filter(|o| **o).count() != 1 {
            return Err(format!("t{i}: outcomes {outcomes:?} (dead {d:?}): {s:?}").into());
        }
        for (slot, o) in tally.iter_mut().zip(outcomes) {
            *slot += usize::from(o);
        }
        match cancel {
            Some(Answer::Cancelled(n)) | Some(Answer::Delivered(n)) if n != k => {
                return Err(
                    format!("t{i}: cancel counted {n} deliveries, {k} received: {s:?}").into(),
                )
            }
            _ => {}
        }
        if let Some((attempts, error)) = d {
            let by_nack = s.nack_dead().map(|a| nack_text(i, a));
            if *attempts != MAX_ATTEMPTS
                || k != MAX_ATTEMPTS
                || (by_nack.as_ref() != Some(error) && *error != lease_error())
            {
                return Err(format!("t{i}: dead letter ({attempts}, {error:?}): {s:?}").into());
            }
        }
        for &(attempt, answer) in s.acks.iter().chain(&s.nacks) {
            let expired_ok = k > attempt
                || cancel == Some(Answer::Cancelled(attempt))
                || cancel == Some(Answer::Delivered(attempt))
                || d.is_some_and(|(a, e)| *a == attempt && *e == lease_error());
            let ok = match answer {
                Answer::Ok => attempt == k,
                // The lease was over: `LeaseExpired` while the task lives on (redelivered,
                // waiting for a retry, held after a cancel, or its dead-lettering expiry not yet
                // processed), `NotOutstanding` once it has finished.
                Answer::Expired | Answer::NotOutstanding => expired_ok,
                _ => true,
            };
            if !ok {
                return Err(format!("t{i}: attempt {attempt} answered {answer:?}: {s:?}").into());
            }
        }
    }
    Ok(tally)
}

fn dead_by_task(engine: &Engine) -> TestResult<BTreeMap<usize, (u32, String)>> {
    engine
        .dead_letters()
        .into_iter()
        .map(|d| Ok((task_of(&d.key)?, (d.attempts, d.error))))
        .collect()
}

/// In process: the race runs to the end on simulated storage (Sync); every task has one
/// consistent outcome; the write-ahead log agrees (a cancelled task's last record is its
/// CANCEL; an acked one's is its ACK, unless a cancel abandoned it first; a dead letter's is
/// DEAD; DELIVER records number the attempts handed out); a power cut and reopen change
/// nothing.
#[test]
fn cancel_racing_delivery_lease_expiry_and_ack() -> TestResult {
    let n = scaled(2_000, 50_000);
    let mut h = SimHarness::new(0xDC, race_config(Durability::Sync))?;
    schedule_race(h.engine(), n)?;
    let log: Mutex<Vec<Event>> = Mutex::new(Vec::new());
    let emit = |_: usize, e: Event| -> TestResult {
        log.lock().map_err(|_| "poisoned")?.push(e);
        Ok(())
    };
    run_race(h.engine(), &h.clock, n, 0xDC, &emit)?;
    let events = log.into_inner().map_err(|_| "poisoned")?;
    let seen = by_task(&events, n)?;
    let dead = dead_by_task(h.engine())?;
    let tally = check_complete(&seen, &dead)?;
    assert_eq!(tally.iter().sum::<usize>(), n);
    eprintln!(
        "{n} tasks, {} events: cancelled waiting {}, cancelled held {}, acked {}, dead {}",
        events.len(),
        tally[0],
        tally[1],
        tally[2],
        tally[3]
    );

    // The write-ahead log agrees.
    h.stop(Stop::Clean)?;
    let mut records: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    let mut keys: BTreeMap<u64, usize> = BTreeMap::new();
    let mut bad = None;
    kairos_wal::scan(
        &h.sim,
        &h.wal_dir(),
        u32::MAX,
        &mut |view| match Record::decode(view.record_type, view.body) {
            Ok(Record::Schedule { id, key, .. }) => match task_of(key) {
                Ok(t) => {
                    keys.insert(id.0, t);
                }
                Err(e) => bad = Some(e.to_string()),
            },
            Ok(r) => {
                let id = match r {
                    Record::Cancel { id }
                    | Record::Ack { id }
                    | Record::Retry { id, .. }
                    | Record::Dead { id, .. }
                    | Record::Purge { id }
                    | Record::Reschedule { id, .. }
                    | Record::Release { id }
                    | Record::Deliver { id, .. }
                    | Record::Schedule { id, .. } => id,
                };
                match keys.get(&id.0) {
                    Some(&t) => records.entry(t).or_default().push(r.record_type()),
                    None => bad = Some(format!("record for unknown task {r:?}")),
                }
            }
            Err(e) => bad = Some(e.to_string()),
        },
    )?;
    if let Some(e) = bad {
        return Err(e.into());
    }
    for (i, s) in seen.iter().enumerate() {
        let r = records.get(&i).cloned().unwrap_or_default();
        let delivers = r.iter().filter(|t| **t == RECORD_DELIVER).count();
        let last = r.last().copied();
        let k = s.max_attempt() as usize;
        let ok = match s.winning_cancel() {
            // Taken back from the ready queue: one DELIVER more than received.
            Some(Answer::Cancelled(_)) => {
                last == Some(RECORD_CANCEL) && (delivers == k || delivers == k + 1)
            }
            Some(Answer::Delivered(_)) => last == Some(RECORD_CANCEL) && delivers == k,
            _ if dead.contains_key(&i) => last == Some(RECORD_DEAD) && delivers == k,
            _ => last == Some(RECORD_ACK) && delivers == k,
        };
        if !ok {
            return Err(format!("t{i}: log {r:?} disagrees with {s:?}").into());
        }
    }

    h.start()?;
    h.restart(Stop::PowerCut)?;
    let e = h.engine();
    assert_eq!(
        (e.recovery().pending, e.recovery().dead_letters),
        (0, dead.len())
    );
    assert_eq!(dead_by_task(e)?, dead);
    assert!(h.advance(ms(3_600_000))?.is_empty());
    h.stop(Stop::Clean)
}

// ---------------------------------------------------------------------------------------------
// The SIGKILL version.

/// Set in the child: the name of the test whose child body to run.
const ROLE_VAR: &str = "KAIROS_DELIVERY_CRASH_CHILD";
const DIR_VAR: &str = "KAIROS_DELIVERY_CRASH_DIR";
const SEED_VAR: &str = "KAIROS_DELIVERY_CRASH_SEED";
const TASKS_VAR: &str = "KAIROS_DELIVERY_CRASH_TASKS";
/// Marks protocol lines in the child's stdout (libtest may print its own text before one).
const MARK: &str = "@@kairos-dc:";
const SIGKILL_TEST: &str = "sigkill_during_the_race_keeps_every_observed_answer";

fn env_u64(name: &str) -> TestResult<u64> {
    Ok(std::env::var(name)?.parse()?)
}

/// Starts this test binary running only the SIGKILL test in child mode.
fn spawn_child(dir: &Path, seed: u64, tasks: usize) -> TestResult<ChildProc> {
    ChildProc::spawn(
        SIGKILL_TEST,
        MARK,
        &[
            (ROLE_VAR, SIGKILL_TEST.to_string()),
            (DIR_VAR, dir.display().to_string()),
            (SEED_VAR, seed.to_string()),
            (TASKS_VAR, tasks.to_string()),
        ],
    )
}

/// Prints one protocol line (in the child); the stdout lock keeps lines from different
/// threads whole.
fn report(line: &str) -> TestResult {
    common::child::report(MARK, line)
}

/// Child: the race on a real directory, reporting every answer; then waits for the kill.
fn sigkill_child() -> TestResult {
    let dir = std::env::var(DIR_VAR)?;
    let seed = env_u64(SEED_VAR)?;
    let n = env_u64(TASKS_VAR)? as usize;
    let clock = ManualClock::new(START_MS);
    let engine = Engine::open_with(
        &dir,
        race_config(Durability::Sync),
        Arc::new(FsStorage),
        Arc::new(clock.clone()),
    )?;
    schedule_race(&engine, n)?;
    report("ready")?;
    let emit = |_: usize, e: Event| report(&e.to_line());
    run_race(&engine, &clock, n, seed, &emit)?;
    report("done")?;
    loop {
        std::thread::park(); // until the SIGKILL
    }
}

/// Out of process: a child runs the race on a real directory under `Sync` and is SIGKILLed
/// after a random number of reported answers (sometimes after it finished). The parent
/// reopens the directory and checks that every observed answer still holds: a task observed
/// `Cancelled` or `AlreadyDelivered` or acked is never delivered again nor dead-lettered; a
/// nack observed `DeadLettered` left a dead letter; any other task is delivered again with an
/// attempt above every observed one, or dead-lettered after its last attempt; at most one
/// task per thread may have been finished by a call the kill cut short. Then everything is
/// acked, and a second reopen finds nothing pending.
#[test]
fn sigkill_during_the_race_keeps_every_observed_answer() -> TestResult {
    if std::env::var(ROLE_VAR).as_deref() == Ok(SIGKILL_TEST) {
        return sigkill_child();
    }
    // CI: a dozen kills; `KAIROS_CRASH_KILLS=1000` for a long run.
    let rounds = std::env::var("KAIROS_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| scaled(12, 1_000) as u64);
    let n = 300;
    // Each run explores other kill points; KAIROS_TEST_SEED repeats one.
    let base_seed: u64 = std::env::var("KAIROS_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("KAIROS_TEST_SEED={base_seed}");
    let mut rng = SplitMix(base_seed);
    for round in 0..rounds {
        let dir = tempfile::tempdir()?;
        let seed = base_seed.wrapping_add(round);
        let mut child = spawn_child(dir.path(), seed, n)?;
        match child.next_line()? {
            Some(l) if l == "ready" => {}
            other => {
                return Err(child.fail(format!("round {round}: child did not start: {other:?}")))
            }
        }
        // Each task makes a few answers; kill somewhere in the first ~3 per task.
        let kill_after = rng.range(1, 3 * n as u64) as usize;
        let mut events = Vec::new();
        let mut finished = false;
        while events.len() < kill_after {
            match child.next_line()? {
                Some(l) if l == "done" => {
                    finished = true;
                    break;
                }
                Some(l) => events.push(Event::parse(&l).map_err(|e| child.fail(e.to_string()))?),
                None => return Err(child.fail(format!("round {round}: child ended early"))),
            }
        }
        child.kill()?;
        // Lines already in the pipe are answers returned before the kill, too.
        while let Some(l) = child.next_line()? {
            if l == "done" {
                finished = true;
            } else {
                events.push(Event::parse(&l)?);
            }
        }
        let (success, _) = child.wait()?;
        assert!(!success, "round {round}: the child exited by itself");

        let seen = by_task(&events, n)?;
        for (i, s) in seen.iter().enumerate() {
            check_observed(i, s, false).map_err(|e| format!("round {round}: {e}"))?;
        }

        // Reopen well after every due time and retry: everything left comes out at once.
        let clock = ManualClock::new(START_MS + 3_600_000);
        let open = || {
            Engine::open_with(
                dir.path(),
                race_config(Durability::Sync),
                Arc::new(FsStorage),
                Arc::new(clock.clone()),
            )
        };
        let engine = open()?;
        let dead = dead_by_task(&engine)?;
        let mut again: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        loop {
            let ds = drain(&engine)?;
            if ds.is_empty() {
                break;
            }
            for d in &ds {
                again
                    .entry(task_of(d.key())?)
                    .or_default()
                    .push(d.attempt());
            }
            engine.ack_many(&ds)?;
        }
        assert_eq!(engine.stats().pending, 0, "round {round}");
        let mut cut_short = Vec::new();
        for (i, s) in seen.iter().enumerate() {
            let fail = |what: &str| -> common::BoxError {
                format!(
                    "round {round}, t{i}: {what}; observed {s:?}, dead {:?}, again {:?}",
                    dead.get(&i),
                    again.get(&i)
                )
                .into()
            };
            let finished_seen = s.finished();
            if finished_seen && (again.contains_key(&i) || dead.contains_key(&i)) {
                return Err(fail("finished before the kill, alive after it"));
            }
            if let Some(attempt) = s.nack_dead() {
                match dead.get(&i) {
                    Some((MAX_ATTEMPTS, e)) if *e == nack_text(i, attempt) => {}
                    _ => return Err(fail("dead letter lost")),
                }
            }
            if let Some((attempts, error)) = dead.get(&i) {
                let ok = *attempts == MAX_ATTEMPTS
                    && s.max_attempt() <= MAX_ATTEMPTS
                    && (error.starts_with("nack of ")
                        || *error == lease_error()
                        || error.starts_with("in flight when the engine stopped"));
                if !ok {
                    return Err(fail("unexpected dead letter"));
                }
            }
            if let Some(attempts) = again.get(&i) {
                if attempts.len() != 1 || attempts[0] <= s.max_attempt() {
                    return Err(fail("redelivered with a stale attempt"));
                }
            }
            if !finished_seen && !dead.contains_key(&i) && !again.contains_key(&i) {
                cut_short.push(i);
            }
        }
        if cut_short.len() > CONSUMERS + CANCELLERS {
            return Err(format!(
                "round {round}: {} tasks vanished (at most one per thread may have been finished \
                 by a call cut short): {cut_short:?}",
                cut_short.len()
            )
            .into());
        }
        engine.shutdown()?;
        drop(engine);
        let engine = open()?;
        assert_eq!(engine.recovery().pending, 0, "round {round}");
        assert_eq!(dead_by_task(&engine)?, dead, "round {round}");
        engine.shutdown()?;
        eprintln!(
            "round {round}: killed after {} answers{}; {} dead letters, {} delivered again, {} \
             finished by a call cut short",
            events.len(),
            if finished { " (race finished)" } else { "" },
            dead.len(),
            again.len(),
            cut_short.len()
        );
    }
    Ok(())
}
