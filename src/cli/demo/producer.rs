//! Producers: schedule the orders' timeouts in batches (`schedule_many`) as
//! fast as the engine takes them, and hand each paid order's cancel to the
//! canceller's plan.

use super::canceller::PlannedCancel;
use super::context::Context;
use crossbeam_channel::Sender;
use kairos::{Due, NewTask, ScheduleError};
use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the producers share the work.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Producer threads; batch `k` goes to producer `k mod producers`.
    pub producers: usize,
    /// Tasks per `schedule_many` call.
    pub batch: usize,
    /// Orders arriving per second, or `None` for as fast as the engine takes
    /// them. Batch `k` is scheduled no earlier than `k × batch / rate` after
    /// the start.
    pub rate: Option<f64>,
    /// The start of the run.
    pub start: Instant,
}

/// One `schedule_many` call: when it started and ended.
pub type Call = (Instant, Instant);

/// Starts the producer threads. Each returns its successful calls.
pub fn spawn(
    ctx: &Arc<Context>,
    pace: Pace,
    plan: &Sender<Vec<PlannedCancel>>,
) -> std::io::Result<Vec<JoinHandle<Vec<Call>>>> {
    (0..pace.producers)
        .map(|first| {
            let ctx = Arc::clone(ctx);
            let plan = plan.clone();
            std::thread::Builder::new()
                .name(format!("demo-producer-{first}"))
                .spawn(move || produce(&ctx, first, pace, &plan))
        })
        .collect()
}

/// Schedules batches `first`, `first + producers`, … until done or stopped.
fn produce(
    ctx: &Context,
    first: usize,
    pace: Pace,
    plan: &Sender<Vec<PlannedCancel>>,
) -> Vec<Call> {
    let tasks = ctx.workload.tasks as usize;
    let mut generation = 1;
    let mut calls = Vec::new();
    for start in (first * pace.batch..tasks).step_by(pace.producers * pace.batch) {
        wait_for_arrival(pace, start);
        let end = (start + pace.batch).min(tasks);
        // Both bounds are ≤ `tasks`, a u32.
        let range = start as u32..end as u32;
        match schedule_batch(ctx, range, generation, plan) {
            Some((g, call)) => {
                generation = g;
                calls.push(call);
            }
            None => break,
        }
    }
    calls
}

/// Sleeps until the order at index `first_task` arrives, if paced.
fn wait_for_arrival(pace: Pace, first_task: usize) {
    if let Some(rate) = pace.rate {
        // `--rate` is at least 0.001 and the default spreads the tasks over the span, so this
        // stays within a Duration and an Instant; past them, no wait rather than a panic.
        let due = Duration::try_from_secs_f64(first_task as f64 / rate)
            .ok()
            .and_then(|after| pace.start.checked_add(after));
        if let Some(due) = due {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
    }
}

/// Schedules one batch, marks its tasks scheduled and plans the cancels of
/// the paid ones. Returns the generation that took it and the call's
/// timing; `None` if stopped.
fn schedule_batch(
    ctx: &Context,
    range: Range<u32>,
    min_generation: u32,
    plan: &Sender<Vec<PlannedCancel>>,
) -> Option<(u32, Call)> {
    let w = &ctx.workload;
    let specs: Vec<_> = range.clone().map(|i| w.spec(i)).collect();
    let keys: Vec<String> = range.clone().map(|i| w.key(i)).collect();
    let payloads: Vec<Vec<u8>> = range
        .clone()
        .zip(&specs)
        .map(|(i, s)| w.payload(i, s))
        .collect();
    let tasks: Vec<NewTask<'_>> = specs
        .iter()
        .zip(&keys)
        .zip(&payloads)
        .map(|((spec, key), payload)| NewTask {
            key: key.as_bytes(),
            due: Due::After(spec.delay),
            payload,
        })
        .collect();
    let (generation, issued_at) = submit(ctx, &tasks, min_generation)?;
    let call = (issued_at, Instant::now());
    range.clone().for_each(|i| ctx.tracker.on_scheduled(i));
    let cancels: Vec<PlannedCancel> = range
        .zip(&specs)
        .filter_map(|(index, spec)| {
            let after = spec.paid_after?;
            Some(PlannedCancel {
                at: issued_at + after,
                index,
            })
        })
        .collect();
    let planned = &ctx.tracker.events.cancel_planned;
    planned.fetch_add(cancels.len() as u64, Relaxed);
    // The canceller outlives the producers unless the run is aborting.
    let _ = plan.send(cancels);
    Some((generation, call))
}

/// Calls `schedule_many`, retrying on the next generation if the engine shut
/// down first (a refused batch is never partly applied). Returns the
/// generation and the moment of the successful call.
fn submit(ctx: &Context, tasks: &[NewTask<'_>], mut min_generation: u32) -> Option<(u32, Instant)> {
    loop {
        let (generation, engine) = ctx.cell.get(min_generation)?;
        let issued_at = Instant::now();
        match engine.schedule_many(tasks) {
            Ok(_) => return Some((generation, issued_at)),
            Err(ScheduleError::Closed) => min_generation = generation + 1,
            Err(e) => {
                ctx.fail(format!("schedule_many failed: {e}"));
                return None;
            }
        }
    }
}
