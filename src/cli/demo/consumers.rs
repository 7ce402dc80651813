//! Consumers of one engine generation: receiver threads that take due tasks
//! and check them, and acker threads that acknowledge them — or nack them,
//! for the deliveries the workload plans to fail.
//!
//! Receiving and answering are split so that the receipt time — what
//! lateness is measured on — never waits for a disk: under
//! `Durability::Sync` an ack or nack returns after an fdatasync. Ackers take
//! whatever is waiting and ack it with one `ack_many` (one log write), so a
//! couple of them keep up with a burst of deliveries.
//!
//! In the first generation one more receiver "crashes": it takes up to
//! `crash_holding` deliveries of unpaid orders and never answers them, then
//! stops. Their leases expire and the engine delivers them again (attempt 2)
//! to the other receivers.

use super::context::Context;
use super::tracker::{Refusal, Tracker};
use super::workload::Fate;
use crossbeam_channel::{Receiver, Sender};
use kairos::{AckError, Consumer, Delivery, Engine, NackOutcome, RecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One receipt, for the lateness figures.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// The task's due time, UTC ms.
    pub due_ms: u64,
    /// Wall-clock time the consumer got it, UTC µs.
    pub received_us: u64,
    /// 1 for a first delivery.
    pub attempt: u32,
    /// Engine generation that delivered it (1 before the restart).
    pub generation: u32,
}

/// How the consumers of a generation behave.
#[derive(Debug, Clone, Copy)]
pub struct Crew {
    /// Receiver threads.
    pub receivers: usize,
    /// Acker threads.
    pub ackers: usize,
    /// Deliveries the crashing receiver holds before it stops (0: no such
    /// receiver). Only the first generation has one.
    pub crash_holding: usize,
    /// Retry delay asked for by each nack.
    pub retry_after: Duration,
}

/// A delivery on its way to an acker: ack it, or nack it with this error.
struct Job {
    index: u32,
    delivery: Delivery,
    fail: Option<String>,
}

/// The consumer threads of one engine generation. They end when that
/// engine shuts down.
#[derive(Debug)]
pub struct Generation {
    number: u32,
    receivers: Vec<JoinHandle<Vec<Sample>>>,
    ackers: Vec<JoinHandle<()>>,
}

impl Generation {
    /// Starts the receivers and ackers of `crew` on `engine`, generation
    /// `number`.
    pub fn spawn(
        ctx: &Arc<Context>,
        engine: &Engine,
        number: u32,
        crew: Crew,
    ) -> std::io::Result<Generation> {
        let (job_tx, job_rx) = crossbeam_channel::unbounded();
        let mut receivers = (0..crew.receivers)
            .map(|i| {
                let (ctx, consumer, jobs) = (Arc::clone(ctx), engine.consumer(), job_tx.clone());
                std::thread::Builder::new()
                    .name(format!("demo-recv-{number}-{i}"))
                    .spawn(move || receive(&ctx, &consumer, &jobs, number, None))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        if number == 1 && crew.crash_holding > 0 {
            let (ctx, consumer, jobs) = (Arc::clone(ctx), engine.consumer(), job_tx.clone());
            let holding = crew.crash_holding;
            receivers.push(
                std::thread::Builder::new()
                    .name(format!("demo-crash-{number}"))
                    .spawn(move || receive(&ctx, &consumer, &jobs, number, Some(holding)))?,
            );
        }
        let ackers = (0..crew.ackers)
            .map(|i| {
                let (ctx, consumer, jobs) = (Arc::clone(ctx), engine.consumer(), job_rx.clone());
                std::thread::Builder::new()
                    .name(format!("demo-ack-{number}-{i}"))
                    .spawn(move || answer(&ctx, &consumer, &jobs, crew.retry_after))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Generation {
            number,
            receivers,
            ackers,
        })
    }

    /// Waits for every thread (call after the engine's shutdown) and returns
    /// the receipts.
    pub fn join(self) -> Vec<Sample> {
        let mut samples = Vec::new();
        for handle in self.receivers {
            match handle.join() {
                Ok(mut s) => samples.append(&mut s),
                Err(_) => errln!("kairos: a receiver of generation {} panicked", self.number),
            }
        }
        for handle in self.ackers {
            if handle.join().is_err() {
                errln!("kairos: an acker of generation {} panicked", self.number);
            }
        }
        samples
    }
}

/// Receives until the engine shuts down; checks each delivery and passes it
/// to the ackers with what to answer. A receiver with `crash_after` is the
/// crashing one: it keeps (never answers) the first `crash_after`
/// deliveries of unpaid orders, then stops.
fn receive(
    ctx: &Context,
    consumer: &Consumer,
    jobs: &Sender<Job>,
    generation: u32,
    crash_after: Option<usize>,
) -> Vec<Sample> {
    let mut samples = Vec::with_capacity(4096);
    let mut held = 0;
    loop {
        match consumer.recv() {
            Ok(delivery) => {
                let received_us = wall_clock_us();
                samples.push(Sample {
                    due_ms: delivery.due_ms(),
                    received_us,
                    attempt: delivery.attempt(),
                    generation,
                });
                let Some(index) = check(ctx, &delivery, received_us, generation) else {
                    continue;
                };
                // An unpaid order is never cancelled, so a task held here
                // always comes back: through its lease's expiry, or the restart.
                if let Some(limit) = crash_after {
                    if ctx.workload.spec(index).paid_after.is_none() {
                        Tracker::count(&ctx.tracker.events.crashed_holding);
                        held += 1;
                        if held >= limit {
                            return samples; // "crashed", holding them
                        }
                        continue;
                    }
                }
                let fail = failure(ctx, index, delivery.attempt());
                // The ackers live until every sender is gone.
                let _ = jobs.send(Job {
                    index,
                    delivery,
                    fail,
                });
            }
            Err(RecvError::Closed) => return samples,
            Err(e) => {
                ctx.fail(format!("recv failed: {e}"));
                return samples;
            }
        }
    }
}

/// The error a delivery fails with, if the workload plans it to fail.
fn failure(ctx: &Context, index: u32, attempt: u32) -> Option<String> {
    match ctx.workload.fate(index) {
        Fate::Poison => Some(format!(
            "the payment service rejects this order (attempt {attempt})"
        )),
        Fate::FailFirst if attempt == 1 => {
            Some("the payment service timed out (attempt 1)".to_string())
        }
        _ => None,
    }
}

/// Records the receipt; counts an early, foreign or altered delivery.
/// Returns the task index, or `None` for a key not of this run.
fn check(ctx: &Context, delivery: &Delivery, received_us: u64, generation: u32) -> Option<u32> {
    let events = &ctx.tracker.events;
    let Some(index) = ctx.workload.index_of(delivery.key()) else {
        Tracker::count(&events.foreign_keys);
        return None;
    };
    ctx.tracker
        .on_receipt(index, delivery.attempt(), generation);
    if received_us < delivery.due_ms().saturating_mul(1000) {
        Tracker::count(&events.early);
    }
    let spec = ctx.workload.spec(index);
    if delivery.payload() != ctx.workload.payload(index, &spec) {
        Tracker::count(&events.payload_mismatches);
    }
    Some(index)
}

/// Answers until the receivers hang up, in batches of whatever is waiting:
/// the acks with one `ack_many` (one log write), the nacks one by one. An
/// answer refused because the engine shut down is expected: that task is
/// delivered again after the restart (unless it was cancelled meanwhile).
fn answer(ctx: &Context, consumer: &Consumer, jobs: &Receiver<Job>, retry_after: Duration) {
    let mut batch: Vec<Job> = Vec::with_capacity(ACK_BATCH_MAX);
    let mut acks: Vec<Delivery> = Vec::with_capacity(ACK_BATCH_MAX);
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while batch.len() < ACK_BATCH_MAX {
            match jobs.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        for job in &batch {
            if let Some(error) = &job.fail {
                if let Err(e) = nack(ctx, consumer, job, error, retry_after) {
                    ctx.fail(e);
                    return;
                }
            }
        }
        let ackable = || batch.iter().filter(|j| j.fail.is_none());
        acks.extend(ackable().map(|j| j.delivery.clone()));
        let acked = if acks.is_empty() {
            Ok(())
        } else {
            consumer.ack_many(&acks)
        };
        let outcome = match acked {
            Ok(()) => {
                ackable().for_each(|j| ctx.tracker.on_ack(j.index));
                Ok(())
            }
            Err(
                AckError::Closed | AckError::NotOutstanding { .. } | AckError::LeaseExpired { .. },
            ) => {
                // Ack one by one so the deliveries still outstanding are acked.
                ackable().try_for_each(|j| ack(ctx, consumer, j))
            }
            Err(e) => Err(format!("ack failed: {e}")),
        };
        if let Err(e) = outcome {
            ctx.fail(e);
            return;
        }
        batch.clear();
        acks.clear();
    }
}

/// Acks one delivery, recording the outcome. Errors are unexpected ones.
fn ack(ctx: &Context, consumer: &Consumer, job: &Job) -> Result<(), String> {
    match consumer.ack(&job.delivery) {
        Ok(()) => ctx.tracker.on_ack(job.index),
        Err(e) => refused(ctx, job, e).map_err(|e| format!("ack failed: {e}"))?,
    }
    Ok(())
}

/// Nacks one delivery, recording the outcome. Errors are unexpected ones.
fn nack(
    ctx: &Context,
    consumer: &Consumer,
    job: &Job,
    error: &str,
    retry_after: Duration,
) -> Result<(), String> {
    ctx.tracker.on_nack_sent(job.index);
    match consumer.nack(&job.delivery, Some(retry_after), error) {
        Ok(outcome) => ctx.tracker.on_nacked(
            job.index,
            matches!(outcome, NackOutcome::Retry { .. }),
            outcome == NackOutcome::DeadLettered,
        ),
        Err(e) => refused(ctx, job, e).map_err(|e| format!("nack failed: {e}"))?,
    }
    Ok(())
}

/// Records an ack or nack the engine refused for an expected reason; gives
/// back any other error.
fn refused(ctx: &Context, job: &Job, error: AckError) -> Result<(), AckError> {
    let why = match error {
        AckError::Closed => Refusal::Closed,
        AckError::LeaseExpired { .. } => Refusal::LeaseExpired,
        AckError::NotOutstanding { .. } => Refusal::Stale,
        other => return Err(other),
    };
    ctx.tracker
        .on_refused(job.index, job.delivery.attempt(), why);
    Ok(())
}

/// Most deliveries acked with one `ack_many`.
const ACK_BATCH_MAX: usize = 512;

/// Wall-clock time, µs since the Unix epoch.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
