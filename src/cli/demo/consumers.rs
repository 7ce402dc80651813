//! Consumers of one engine generation: receiver threads that take due tasks
//! and check them, and acker threads that acknowledge them.
//!
//! Receiving and acking are split so that the receipt time — what lateness
//! is measured on — never waits for a disk: under `Durability::Sync` an ack
//! returns after an fdatasync. Ackers take whatever is waiting and ack it
//! with one `ack_many` (one log write), so a couple of them keep up with a
//! burst of deliveries.

use super::context::Context;
use super::tracker::Tracker;
use crossbeam_channel::{Receiver, Sender};
use kairos::{AckError, Consumer, Delivery, Engine, RecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

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

/// The consumer threads of one engine generation. They end when that
/// engine shuts down.
#[derive(Debug)]
pub struct Generation {
    number: u32,
    receivers: Vec<JoinHandle<Vec<Sample>>>,
    ackers: Vec<JoinHandle<()>>,
}

impl Generation {
    /// Starts `receivers` receiver threads and `ackers` acker threads on
    /// `engine`, generation `number`.
    pub fn spawn(
        ctx: &Arc<Context>,
        engine: &Engine,
        number: u32,
        receivers: usize,
        ackers: usize,
    ) -> std::io::Result<Generation> {
        let (ack_tx, ack_rx) = crossbeam_channel::unbounded();
        let receivers = (0..receivers)
            .map(|i| {
                let (ctx, consumer, acks) = (Arc::clone(ctx), engine.consumer(), ack_tx.clone());
                std::thread::Builder::new()
                    .name(format!("demo-recv-{number}-{i}"))
                    .spawn(move || receive(&ctx, &consumer, &acks, number))
            })
            .collect::<std::io::Result<_>>()?;
        let ackers = (0..ackers)
            .map(|i| {
                let (ctx, consumer, acks) = (Arc::clone(ctx), engine.consumer(), ack_rx.clone());
                std::thread::Builder::new()
                    .name(format!("demo-ack-{number}-{i}"))
                    .spawn(move || acknowledge(&ctx, &consumer, &acks))
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
                Err(_) => eprintln!("kairos: a receiver of generation {} panicked", self.number),
            }
        }
        for handle in self.ackers {
            if handle.join().is_err() {
                eprintln!("kairos: an acker of generation {} panicked", self.number);
            }
        }
        samples
    }
}

/// Receives until the engine shuts down; checks each delivery and passes it
/// to the ackers.
fn receive(
    ctx: &Context,
    consumer: &Consumer,
    acks: &Sender<(u32, Delivery)>,
    generation: u32,
) -> Vec<Sample> {
    let mut samples = Vec::with_capacity(4096);
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
                if let Some(index) = check(ctx, &delivery, received_us) {
                    // The ackers live until every sender is gone.
                    let _ = acks.send((index, delivery));
                }
            }
            Err(RecvError::Closed) => return samples,
            Err(e) => {
                ctx.fail(format!("recv failed: {e}"));
                return samples;
            }
        }
    }
}

/// Records the receipt; counts an early, foreign or altered delivery.
/// Returns the task index, or `None` for a key not of this run.
fn check(ctx: &Context, delivery: &Delivery, received_us: u64) -> Option<u32> {
    let events = &ctx.tracker.events;
    let Some(index) = ctx.workload.index_of(delivery.key()) else {
        Tracker::count(&events.foreign_keys);
        return None;
    };
    ctx.tracker.on_receipt(index);
    if received_us < delivery.due_ms().saturating_mul(1000) {
        Tracker::count(&events.early);
    }
    let spec = ctx.workload.spec(index);
    if delivery.payload() != ctx.workload.payload(index, &spec) {
        Tracker::count(&events.payload_mismatches);
    }
    Some(index)
}

/// Acks until the receivers hang up, in batches of whatever is waiting (one
/// log write per batch). An ack refused because the engine shut down is
/// expected: that task is delivered again after the restart.
fn acknowledge(ctx: &Context, consumer: &Consumer, acks: &Receiver<(u32, Delivery)>) {
    let mut batch: Vec<(u32, Delivery)> = Vec::with_capacity(ACK_BATCH_MAX);
    let mut deliveries: Vec<Delivery> = Vec::with_capacity(ACK_BATCH_MAX);
    while let Ok(first) = acks.recv() {
        batch.push(first);
        while batch.len() < ACK_BATCH_MAX {
            match acks.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        deliveries.extend(batch.iter().map(|(_, d)| d.clone()));
        match consumer.ack_many(&deliveries) {
            Ok(()) => batch
                .iter()
                .for_each(|(index, _)| ctx.tracker.on_ack(*index)),
            Err(AckError::Closed | AckError::NotOutstanding { .. }) => {
                // Ack one by one so the tasks still outstanding are acked.
                for (index, delivery) in &batch {
                    match consumer.ack(delivery) {
                        Ok(()) => ctx.tracker.on_ack(*index),
                        Err(_) => Tracker::count(&ctx.tracker.events.ack_failed),
                    }
                }
            }
            Err(e) => {
                ctx.fail(format!("ack failed: {e}"));
                return;
            }
        }
        batch.clear();
        deliveries.clear();
    }
}

/// Most deliveries acked with one `ack_many`.
const ACK_BATCH_MAX: usize = 512;

/// Wall-clock time, µs since the Unix epoch.
pub fn wall_clock_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
