//! The canceller: works through a time-ordered plan of payments, cancelling
//! each paid order's timeout at its planned moment, and records whether the
//! cancel won (`Cancelled`), caught the task in a consumer's hands
//! (`AlreadyDelivered`: no retry follows, the consumer may still ack) or came
//! too late (`NotFound`).

use super::context::Context;
use super::tracker::Tracker;
use crossbeam_channel::{Receiver, RecvTimeoutError};
use kairos::{CancelError, CancelOutcome};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most keys in one `cancel_many` call. Cancels due together share one log
/// write (one fdatasync under `Sync`).
const CANCEL_BATCH_MAX: usize = 4096;
/// Longest sleep between checks for a stop.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// One planned payment: cancel the timeout of task `index` at `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlannedCancel {
    /// When the order is paid.
    pub at: Instant,
    /// The task.
    pub index: u32,
}

/// The plan: payments ordered by time, earliest first.
type Plan = BinaryHeap<Reverse<PlannedCancel>>;

/// Starts the canceller thread. It ends once every producer has hung up and
/// the plan is done, or when the run stops.
pub fn spawn(
    ctx: &Arc<Context>,
    plans: Receiver<Vec<PlannedCancel>>,
) -> std::io::Result<JoinHandle<()>> {
    let ctx = Arc::clone(ctx);
    std::thread::Builder::new()
        .name("demo-canceller".into())
        .spawn(move || cancel_loop(&ctx, &plans))
}

fn cancel_loop(ctx: &Context, plans: &Receiver<Vec<PlannedCancel>>) {
    let mut plan = Plan::new();
    let mut producing = true;
    let mut generation = 1;
    while !ctx.cell.is_stopped() {
        let wait = next_wait(&plan);
        if producing {
            producing = receive_plans(plans, &mut plan, wait);
        } else if plan.is_empty() {
            return;
        } else {
            std::thread::sleep(wait);
        }
        let due = pop_due(&mut plan, Instant::now());
        if !due.is_empty() {
            match cancel_batch(ctx, &due, generation) {
                Some(g) => generation = g,
                None => return,
            }
        }
    }
}

/// How long to wait for the earliest planned payment (capped).
fn next_wait(plan: &Plan) -> Duration {
    plan.peek().map_or(IDLE_WAIT, |Reverse(first)| {
        first
            .at
            .saturating_duration_since(Instant::now())
            .min(IDLE_WAIT)
    })
}

/// Adds new plans from the producers, waiting up to `wait` for the first.
/// Returns false once every producer has hung up.
fn receive_plans(plans: &Receiver<Vec<PlannedCancel>>, plan: &mut Plan, wait: Duration) -> bool {
    match plans.recv_timeout(wait) {
        Ok(batch) => {
            plan.extend(batch.into_iter().map(Reverse));
            plan.extend(plans.try_iter().flatten().map(Reverse));
            true
        }
        Err(RecvTimeoutError::Timeout) => true,
        Err(RecvTimeoutError::Disconnected) => false,
    }
}

/// Takes the payments due by `now`, earliest first, at most a batch.
fn pop_due(plan: &mut Plan, now: Instant) -> Vec<u32> {
    let mut due = Vec::new();
    while due.len() < CANCEL_BATCH_MAX {
        match plan.peek() {
            Some(Reverse(first)) if first.at <= now => {
                due.push(first.index);
                plan.pop();
            }
            _ => break,
        }
    }
    due
}

/// Cancels `due` with one `cancel_many`, retrying on the next generation if
/// the engine shut down first (a refused call changes nothing). Returns the
/// generation that answered; `None` if the run stopped.
fn cancel_batch(ctx: &Context, due: &[u32], mut min_generation: u32) -> Option<u32> {
    let keys: Vec<String> = due.iter().map(|&i| ctx.workload.key(i)).collect();
    let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
    loop {
        let (generation, engine) = ctx.cell.get(min_generation)?;
        match engine.cancel_many(&keys) {
            Ok(outcomes) => {
                record(ctx, due, &outcomes);
                return Some(generation);
            }
            Err(CancelError::Closed) => min_generation = generation + 1,
            Err(e) => {
                ctx.fail(format!("cancel_many failed: {e}"));
                return None;
            }
        }
    }
}

fn record(ctx: &Context, due: &[u32], outcomes: &[CancelOutcome]) {
    let tracker = &ctx.tracker;
    for (&index, outcome) in due.iter().zip(outcomes) {
        match *outcome {
            CancelOutcome::Cancelled { deliveries } => tracker.on_cancelled(index, deliveries),
            CancelOutcome::AlreadyDelivered { attempt } => {
                tracker.on_cancel_in_flight(index, attempt);
            }
            _ => Tracker::count(&tracker.events.cancel_not_found),
        }
    }
}
