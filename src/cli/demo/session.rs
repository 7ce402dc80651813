//! One demo run, start to end: open the engine, start the threads, restart
//! the engine midway, wait until every task is delivered or cancelled, shut
//! down and collect the findings.

use super::canceller;
use super::consumers::{wall_clock_us, Crew, Generation, Sample};
use super::context::Context;
use super::overflow::{EngineTotals, OverflowFindings, Watch};
use super::producer::{self, Call, Pace};
use super::progress::Progress;
use super::tracker::{EventTally, Tally, Tracker};
use super::workload::{Fate, Workload};
use anyhow::{anyhow, Context as _};
use kairos::{Config, Engine, Recovery};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long past the last due time (plus the downtime) the run waits for
/// stragglers before it gives up and reports them lost.
const GRACE: Duration = Duration::from_secs(30);
/// How often the main thread looks at the progress.
const POLL: Duration = Duration::from_millis(10);

/// Everything a run needs, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The data directory (fresh).
    pub dir: PathBuf,
    /// What to schedule.
    pub workload: Workload,
    /// Engine configuration, the same for both generations.
    pub config: Config,
    /// Producer threads.
    pub producers: usize,
    /// Tasks per `schedule_many`.
    pub batch: usize,
    /// Orders arriving per second (`None`: as fast as possible).
    pub rate: Option<f64>,
    /// Receiver threads per generation.
    pub consumers: usize,
    /// Acker threads per generation.
    pub ackers: usize,
    /// Deliveries the crashing receiver of the first generation holds (0: none).
    pub crash_holding: usize,
    /// Retry delay of each nack.
    pub retry_after: Duration,
    /// Pause between shutdown and reopen.
    pub downtime: Duration,
    /// Whether to draw a progress bar.
    pub progress: bool,
    /// How often the main thread takes a checkpoint (`--horizon`), or never.
    pub checkpoint_every: Option<Duration>,
}

/// What the restart measured.
#[derive(Debug, Clone)]
pub struct Restart {
    /// When it began, after the start.
    pub at: Duration,
    /// `shutdown()` duration.
    pub shutdown: Duration,
    /// `Engine::open` duration.
    pub reopen: Duration,
    /// Live tasks once `shutdown()` returned.
    pub pending_at_shutdown: usize,
    /// The reopened engine's recovery report.
    pub recovery: Recovery,
    /// Wall time the reopen returned, UTC ms.
    pub reopened_at_ms: u64,
}

/// The raw findings of a run.
#[derive(Debug)]
pub struct Findings {
    /// Per-task tally.
    pub tally: Tally,
    /// Event counters.
    pub events: EventTally,
    /// Every receipt, both generations.
    pub samples: Vec<Sample>,
    /// The restart.
    pub restart: Restart,
    /// Start until the last producer finished.
    pub schedule_time: Duration,
    /// Time during which at least one `schedule_many` call was running.
    pub schedule_busy: Duration,
    /// Whole run.
    pub elapsed: Duration,
    /// Live tasks left at the end.
    pub pending_at_end: usize,
    /// Dead letters the last engine kept at the end.
    pub dead_letters_kept: usize,
    /// Whether the run gave up waiting.
    pub timed_out: bool,
    /// Checkpoints taken and payloads on disk.
    pub overflow: OverflowFindings,
    /// The engine's running totals, summed over both generations.
    pub engine_totals: EngineTotals,
}

/// The threads that span both generations.
struct Workers {
    producers: Vec<JoinHandle<Vec<Call>>>,
    canceller: JoinHandle<()>,
}

/// Runs the demo. Errors are unexpected failures (I/O, a poisoned engine),
/// not broken invariants: those are in the findings.
pub fn run(s: &Settings) -> anyhow::Result<Findings> {
    let engine = open(s)?;
    let ctx = Arc::new(Context::new(s.workload, Arc::clone(&engine)));
    let progress = Progress::new(u64::from(s.workload.tasks), s.progress);
    let start = Instant::now();
    let first = Generation::spawn(&ctx, &engine, 1, crew(s))?;
    drop(engine);
    let workers = start_workers(&ctx, s, start)?;
    let span = s.workload.span();
    let deadline = start + span + s.downtime + GRACE;
    let midway = start + span / 2;
    let mut watch = Watch::new(s.checkpoint_every);
    progress.phase("before the restart");
    wait_until(&ctx, &progress, &mut watch, deadline, || {
        Instant::now() >= midway || all_done(&ctx)
    })
    .inspect_err(|_| abort(&ctx))?;
    progress.phase("restarting");
    let (restart, second, mut samples) =
        restart(&ctx, s, first, start, &mut watch).inspect_err(|_| abort(&ctx))?;
    progress.phase("after the restart");
    let done = wait_until(&ctx, &progress, &mut watch, deadline, || all_done(&ctx))
        .inspect_err(|_| abort(&ctx))?;
    let (pending_at_end, dead_letters_kept, mut last) = finish(&ctx, second, &mut watch)?;
    drop(progress);
    samples.append(&mut last);
    let calls = join_workers(workers);
    let workload = s.workload;
    Ok(Findings {
        tally: ctx
            .tracker
            .tally(|index| workload.fate(index) == Fate::Poison),
        events: ctx.tracker.events.snapshot(),
        samples,
        restart,
        schedule_time: last_end(&calls).saturating_duration_since(start),
        schedule_busy: busy_time(calls),
        elapsed: start.elapsed(),
        pending_at_end,
        dead_letters_kept,
        timed_out: !done,
        overflow: watch.findings(),
        engine_totals: watch.engine_totals(),
    })
}

fn open(s: &Settings) -> anyhow::Result<Arc<Engine>> {
    let engine = Engine::open(&s.dir, s.config.clone())
        .with_context(|| format!("cannot open the engine in {}", s.dir.display()))?;
    Ok(Arc::new(engine))
}

/// Starts the canceller and the producers.
fn start_workers(ctx: &Arc<Context>, s: &Settings, start: Instant) -> anyhow::Result<Workers> {
    let (plan_tx, plan_rx) = crossbeam_channel::unbounded();
    let canceller = canceller::spawn(ctx, plan_rx)?;
    let pace = Pace {
        producers: s.producers,
        batch: s.batch,
        rate: s.rate,
        start,
    };
    let producers = producer::spawn(ctx, pace, &plan_tx)?;
    Ok(Workers {
        producers,
        canceller,
    })
}

/// Waits for the producers and the canceller; returns every successful
/// `schedule_many` call.
fn join_workers(workers: Workers) -> Vec<Call> {
    let mut calls = Vec::new();
    for handle in workers.producers {
        match handle.join() {
            Ok(mut c) => calls.append(&mut c),
            Err(_) => errln!("kairos: a producer panicked"),
        }
    }
    if workers.canceller.join().is_err() {
        errln!("kairos: the canceller panicked");
    }
    calls
}

/// When the last call ended (now if there were none).
fn last_end(calls: &[Call]) -> Instant {
    calls.iter().map(|c| c.1).max().unwrap_or_else(Instant::now)
}

/// Length of the union of the calls' intervals: the time during which the
/// engine was busy scheduling.
fn busy_time(mut calls: Vec<Call>) -> Duration {
    calls.sort_unstable();
    let mut busy = Duration::ZERO;
    let mut covered: Option<Call> = None;
    for (start, end) in calls {
        covered = match covered {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                busy += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    busy + covered.map_or(Duration::ZERO, |(s, e)| e - s)
}

/// The consumers of a generation.
fn crew(s: &Settings) -> Crew {
    Crew {
        receivers: s.consumers,
        ackers: s.ackers,
        crash_holding: s.crash_holding,
        retry_after: s.retry_after,
    }
}

/// Whether every task is finished — cancelled, acked or dead-lettered — and
/// the engine holds none any more (a task cancelled in a consumer's hands is
/// finished for the run at once, but held until that consumer answers).
fn all_done(ctx: &Context) -> bool {
    let Some(engine) = ctx.cell.current() else {
        return false;
    };
    note_dead_letters(ctx, &engine);
    ctx.tracker.resolved() >= ctx.workload.tasks as usize && engine.stats().pending == 0
}

/// Marks the engine's dead letters in the tracker: those a nack made are
/// marked already, but a task can also die of a lease that expired on its
/// last attempt, or at the reopen if its last attempt was in flight at the
/// restart, and nobody is told.
fn note_dead_letters(ctx: &Context, engine: &Engine) {
    if engine.stats().dead_letters <= ctx.tracker.dead_lettered() {
        return;
    }
    for letter in engine.dead_letters() {
        if let Some(index) = ctx.workload.index_of(&letter.key) {
            ctx.tracker.on_dead_lettered(index);
        }
    }
}

/// Counts the dead letters whose payload is not the one scheduled as
/// payload mismatches: a dead letter's payload may have been read back from
/// an overflow file (at the reopen, for a last attempt in flight at the
/// shutdown).
fn check_dead_letter_payloads(ctx: &Context, engine: &Engine) {
    for letter in engine.dead_letters() {
        let Some(index) = ctx.workload.index_of(&letter.key) else {
            continue;
        };
        let spec = ctx.workload.spec(index);
        if letter.payload != ctx.workload.payload(index, &spec) {
            Tracker::count(&ctx.tracker.events.payload_mismatches);
        }
    }
}

/// Polls until `done()` (Ok(true)) or the deadline (Ok(false)), taking the
/// `watch`'s checkpoints meanwhile; fails as soon as a thread reports an
/// unexpected error, or a checkpoint fails.
fn wait_until(
    ctx: &Context,
    progress: &Progress,
    watch: &mut Watch,
    deadline: Instant,
    done: impl Fn() -> bool,
) -> anyhow::Result<bool> {
    loop {
        if let Some(error) = ctx.failure() {
            return Err(anyhow!(error));
        }
        watch.tick(ctx)?;
        progress.set(ctx.tracker.resolved() as u64);
        if done() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(POLL);
    }
}

/// Shuts the engine down, waits `downtime`, reopens it on the same
/// directory and starts the next generation of consumers. Returns what it
/// measured, the new generation and the first generation's receipts.
fn restart(
    ctx: &Arc<Context>,
    s: &Settings,
    first: Generation,
    start: Instant,
    watch: &mut Watch,
) -> anyhow::Result<(Restart, Generation, Vec<Sample>)> {
    let at = start.elapsed();
    let engine = ctx
        .cell
        .take()
        .ok_or_else(|| anyhow!("no engine to restart"))?;
    let began = Instant::now();
    engine
        .shutdown()
        .context("shutdown before the restart failed")?;
    let shutdown = began.elapsed();
    let pending_at_shutdown = pending(&engine);
    watch.on_shutdown(&engine);
    let samples = first.join();
    drop(engine);
    std::thread::sleep(s.downtime);
    let began = Instant::now();
    let engine = open(s)?;
    let reopen = began.elapsed();
    let reopened_at_ms = wall_clock_us() / 1000;
    let second = Generation::spawn(ctx, &engine, 2, crew(s))?;
    let recovery = engine.recovery().clone();
    ctx.cell.install(engine);
    let restart = Restart {
        at,
        shutdown,
        reopen,
        pending_at_shutdown,
        recovery,
        reopened_at_ms,
    };
    Ok((restart, second, samples))
}

/// Stops the run and shuts the last engine down; returns the live tasks
/// left, the dead letters kept and the last generation's receipts.
fn finish(
    ctx: &Context,
    last: Generation,
    watch: &mut Watch,
) -> anyhow::Result<(usize, usize, Vec<Sample>)> {
    ctx.cell.stop();
    let engine = ctx
        .cell
        .take()
        .ok_or_else(|| anyhow!("no engine to shut down"))?;
    engine.shutdown().context("final shutdown failed")?;
    watch.on_shutdown(&engine);
    if let Some(error) = ctx.failure() {
        return Err(anyhow!(error));
    }
    let samples = last.join();
    note_dead_letters(ctx, &engine);
    check_dead_letter_payloads(ctx, &engine);
    Ok((pending(&engine), engine.stats().dead_letters, samples))
}

/// Stops the producers and the canceller and shuts the engine down after an
/// unexpected error; threads still running are abandoned to process exit.
fn abort(ctx: &Context) {
    ctx.cell.stop();
    if let Some(engine) = ctx.cell.take() {
        let _ = engine.shutdown();
    }
}

/// Live tasks: scheduled, ready and in flight. Read once `shutdown()` has
/// returned, it is the state the log was closed with: the next open recovers
/// all of them but those cancelled in a consumer's hands (abandoned: their
/// cancel is logged) and those in flight on their last attempt
/// (dead-lettered at the open).
fn pending(engine: &Engine) -> usize {
    let stats = engine.stats();
    stats.pending
}
