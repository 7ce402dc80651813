//! `kairos bench`: a load run on a real data directory. Schedules N tasks in
//! batches, cancels half of them by key, takes a checkpoint, closes the
//! engine, reopens it, and reports throughput, memory per task, disk use and
//! the time of each step. Only the public API is used.

use super::demo::progress::Progress;
use super::demo::workload::{self, Workload};
use super::{DurabilityArgs, DurabilityMode, Verdict};
use anyhow::{bail, Context as _};
use clap::Args;
use kairos::config::{
    BATCH_TASKS_MAX, PAYLOAD_BYTES_MAX_DEFAULT, PENDING_TASKS_LIMIT, RELOCATE_FAR_BYTES_DEFAULT,
};
use kairos::{CancelOutcome, CheckpointReport, Config, Due, Engine, NewTask};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The horizon: tasks due within it belong in the timing wheel, tasks due
/// beyond it in the overflow store (`Config::horizon`'s default, 18 days).
use kairos::config::HORIZON_DEFAULT;

/// Seconds in a day.
const DAY_S: u64 = 86_400;
/// With `--far-fraction`: the earliest due time of a task within the horizon.
const NEAR_MIN: Duration = Duration::from_secs(3_600);
/// With `--far-fraction`: the earliest due time of a task beyond the horizon.
const FAR_MIN: Duration = Duration::from_secs(19 * DAY_S);
/// With `--far-fraction`: the latest due time of a task beyond the horizon.
const FAR_MAX: Duration = Duration::from_secs(365 * DAY_S);
/// Salt of the per-task draw of `--far-fraction`, apart from the demo's draws.
const FAR_SALT: u64 = 0xFA2F_2AC7_0000_0001;

/// Key bytes: `order:` + 10 digits + `:timeout`.
const KEY_BYTES: usize = 24;
const KEY_PREFIX: &[u8] = b"order:";
const KEY_SUFFIX: &[u8] = b":timeout";
/// Digits of the task index in a key (`u32::MAX` has 10).
const KEY_DIGITS: usize = KEY_BYTES - KEY_PREFIX.len() - KEY_SUFFIX.len();

/// Default `--batch`.
const BATCH_DEFAULT: u32 = 10_000;
/// Default `--seed`.
const SEED_DEFAULT: u64 = 42;
/// Largest `--tasks`: the engine's hard limit on live tasks (the bench
/// raises `Config::pending_tasks_max` to the count it schedules).
const TASKS_MAX: u32 = (PENDING_TASKS_LIMIT - 1) as u32;

/// Measure the engine under a load: schedule, cancel, checkpoint, close and
/// reopen; report throughput, memory per task, disk use and recovery time.
#[derive(Debug, Args)]
#[command(long_about = "\
Measure the engine under a load on a real data directory: schedule --tasks tasks in batches \
(schedule_many), cancel half of them by key in batches (cancel_many), take a checkpoint, close \
the engine (shutdown), reopen it and check that it recovered exactly the tasks left.

Keys are 24 bytes (order:0000000042:timeout), payloads --payload-bytes bytes (default 0). Due \
times are drawn per task from --seed: by default with the demo's order-timeout delay mix, \
without its time scale (45 % within 30 minutes, 35 % within 7 days, 20 % within 30 \
days); with --far-fraction F, each task is due beyond the horizon (uniformly between 19 days and \
1 year) with probability F, otherwise uniformly between 1 hour and 18 days. The horizon is 18 \
days. Tasks due within it (wheel tasks) are scheduled first, then the tasks due beyond it \
(overflow tasks), whatever the engine does with them: with the default --resident-window \
(1m, Config::resident_window) every task due later than a minute leaves the wheel's \
memory like an overflow task, wheel task or not. Every task with an odd index is \
cancelled.

With --log-tail N, after the checkpoint N more tasks are scheduled (indices from --tasks on, \
drawn the same way) and the N tasks with the smallest even indices are cancelled, and the \
engine is closed without another checkpoint: the reopen then replays those 2 N records on top \
of the checkpoint, as it does after a crash (a reopen right after a checkpoint replays none).

What the figures mean:
  schedule_per_sec, cancel_per_sec  tasks over the time spent inside schedule_many / \
cancel_many calls (building keys is not counted); under --durability sync each batch waits for \
one fdatasync.
  rss_bytes  the process's peak resident set (VmHWM in /proc/self/status, null where there is \
none), the reopen included.
  ram_bytes_per_wheel_task, ram_bytes_per_overflow_task  growth of the resident set (VmRSS) \
while the wheel tasks were scheduled, divided by their number; then the same for the overflow \
tasks (null when there are none). RSS is process-wide: it includes the allocator's slack and \
the log writer's buffers, and a table that doubles while one kind is scheduled is charged to \
that kind. The payload's bytes are part of the figure: state --payload-bytes with it.
  disk_bytes  the size of every file under DIR after the checkpoint and the close.
  checkpoint_ms  Engine::checkpoint after the cancels: what leaves memory and the live entries \
of compacted files moved to a new overflow file, the live state encoded, the file written and \
synced, the log segments it covers deleted; \
checkpoint_locked_ms is the part spent holding the engine's lock, in many short holds \
(choosing what leaves memory, pointing moved tasks at the new overflow file and taking far \
tasks out of the wheel, encoding the state); checkpoint_longest_hold_ms the longest single \
hold: the longest a producer or the driver waited on it; checkpoint_hold_max_ms the same over \
every checkpoint of the run, the background ones while scheduling and cancelling included.
  close_ms  the shutdown. recovery_ms  the reopen (Engine::open, replaying the log).
  far_tasks_before_checkpoint  tasks the background moves had taken out of the wheel before the \
explicit checkpoint (after the cancels).
  far_tasks_after_recovery  tasks out of the wheel after the reopen (due beyond the far span — \
the resident window within the horizon, Config::far_span — when the checkpoint was taken: 24 \
bytes of memory each). The growth per task while scheduling counts \
those still waiting whole in the wheel (they leave it at a checkpoint, or once \
Config::relocate_far_tasks of them, or Config::relocate_far_bytes of their memory, \
are scheduled; a producer twice that far ahead of the move waits for the next one, which \
lowers schedule_per_sec); ram_bytes_per_task_after_recovery with \
--far-fraction 1 is the figure per far task, with --far-fraction 0 per wheel task (with the \
default window, every --far-fraction task is due an hour or more out, so far too).
  recovered_pending  live tasks after the reopen; it must equal tasks - cancelled (+ N - N \
with --log-tail N), otherwise the exit status is 1.

DIR defaults to a fresh temporary directory, removed afterwards — also when the run is \
interrupted by SIGINT, SIGTERM or SIGHUP (the exit status is then 130, whichever of the three; \
other signals, SIGKILL among them, leave it); a --dir that exists must be an \
empty directory (anything else is refused), and is kept. Timings depend on the machine and its \
load: compare runs made on the same machine, side by side.")]
pub struct BenchArgs {
    /// Data directory [default: a fresh temporary directory, removed afterwards, on
    /// SIGINT, SIGTERM and SIGHUP too].
    /// If it exists it must be empty; it is kept.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Tasks to schedule.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(TASKS_MAX)))]
    tasks: u32,
    /// Share of the tasks due beyond the 18-day horizon, 0..=1 [default: the
    /// demo's order-timeout delay mix instead].
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    far_fraction: Option<f64>,
    /// Payload of every task, bytes.
    #[arg(long, value_name = "P", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=PAYLOAD_BYTES_MAX_DEFAULT as i64))]
    payload_bytes: u32,
    #[command(flatten)]
    durability: DurabilityArgs,
    /// Tasks per schedule_many and keys per cancel_many call.
    #[arg(long, value_name = "N", default_value_t = BATCH_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=BATCH_TASKS_MAX as i64))]
    batch: u32,
    /// Seed of the due times (the same seed draws the same ones).
    #[arg(long, default_value_t = SEED_DEFAULT)]
    seed: u64,
    /// After the checkpoint, schedule N more tasks and cancel N of the
    /// checkpoint's, so the reopen replays 2 N log records on top of it. At
    /// most half of --tasks (rounded up).
    #[arg(long, value_name = "N", default_value_t = 0)]
    log_tail: u32,
    #[command(flatten)]
    tuning: Tuning,
    /// Print one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

/// `--resident-window`: a duration, or `None` for `off`.
#[derive(Debug, Clone, Copy)]
struct ResidentWindow(Option<Duration>);

fn parse_window(s: &str) -> Result<ResidentWindow, String> {
    if s == "off" {
        return Ok(ResidentWindow(None));
    }
    super::parse_duration_or(
        s,
        "use off, 0 or whole numbers with units ms, s, m, h, d (e.g. 1m, 2h)",
    )
    .map(|d| ResidentWindow(Some(d)))
}

/// A share: a number in 0..=1.
fn parse_fraction(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err("must be a number from 0 to 1".into())
    }
}

/// Everything the bench reports; serialized as the `--json` object.
#[derive(Debug, Clone, Serialize)]
struct Report {
    /// Tasks scheduled.
    tasks: u32,
    /// `--far-fraction`, or null for the order-timeout delay mix.
    far_fraction: Option<f64>,
    /// Tasks due within the horizon, scheduled first.
    wheel_tasks: u64,
    /// Tasks due beyond the horizon, scheduled second.
    overflow_tasks: u64,
    /// The horizon used to tell them apart, days.
    horizon_days: u64,
    /// The resident window the engine used, ms (`Config::far_span`: `--resident-window`
    /// raised to the payload window, 60 s, and capped at the horizon); null for `off`.
    resident_window_ms: Option<u64>,
    /// `--resident-window` as given, ms; null for `off`.
    resident_window_given_ms: Option<u64>,
    /// `--relocate-far-bytes`.
    relocate_far_bytes: u64,
    /// Payload of every task, bytes.
    payload_bytes: u32,
    /// Key of every task, bytes.
    key_bytes: usize,
    /// `sync`, `interval` or `buffered`.
    durability: String,
    /// Background sync period under `interval`, ms.
    interval_ms: Option<u64>,
    /// Tasks per `schedule_many`, keys per `cancel_many`.
    batch: u32,
    /// Seed of the due times.
    seed: u64,
    /// The data directory given, or null for a temporary one (removed).
    dir: Option<String>,
    /// Logical cores of the machine.
    cores: usize,
    /// Time spent inside `schedule_many` calls, ms.
    schedule_ms: f64,
    /// Tasks scheduled per second of `schedule_ms`.
    schedule_per_sec: f64,
    /// Cancels that returned `Cancelled`.
    cancelled: u64,
    /// Time spent inside `cancel_many` calls, ms.
    cancel_ms: f64,
    /// Keys cancelled per second of `cancel_ms`; null with no cancel.
    cancel_per_sec: Option<f64>,
    /// Peak resident set of the process (VmHWM), bytes; null if unknown.
    rss_bytes: Option<u64>,
    /// VmRSS growth per wheel task, bytes; null if none or unknown.
    ram_bytes_per_wheel_task: Option<f64>,
    /// VmRSS growth per overflow task, bytes; null if none or unknown.
    ram_bytes_per_overflow_task: Option<f64>,
    /// Sum of file sizes under the directory after checkpoint and close.
    disk_bytes: u64,
    /// Time of the checkpoint, ms.
    checkpoint_ms: f64,
    /// Of `checkpoint_ms`, the engine's lock held (`CheckpointReport::locked`).
    checkpoint_locked_ms: f64,
    /// The longest single hold (`CheckpointReport::longest_hold`).
    checkpoint_longest_hold_ms: f64,
    /// The longest single hold by any checkpoint of the run, background
    /// ones included (`Stats::checkpoint_hold_max`).
    checkpoint_hold_max_ms: f64,
    /// Payloads that checkpoint moved out of memory into an overflow file.
    payloads_moved: u64,
    /// After the reopen: live tasks whose payload is on disk.
    payloads_on_disk: u64,
    /// After the reopen: payload bytes held in memory.
    payload_bytes_in_memory: u64,
    /// Before the explicit checkpoint, after the cancels: far tasks the
    /// background moves had taken out of the wheel (`Stats::far`).
    far_tasks_before_checkpoint: u64,
    /// After the reopen: far tasks — due beyond the far span, out of the
    /// wheel (`Stats::far`).
    far_tasks_after_recovery: u64,
    /// VmRSS growth over the reopen, per recovered task, bytes (the
    /// allocator may reuse memory the first engine freed: a lower bound).
    ram_bytes_per_task_after_recovery: Option<f64>,
    /// Time of the shutdown, ms.
    close_ms: f64,
    /// Time of the reopen, ms.
    recovery_ms: f64,
    /// Live tasks after the reopen (`recovery().pending`).
    recovered_pending: u64,
    /// `--log-tail`: tasks scheduled, and tasks of the checkpoint
    /// cancelled, after the checkpoint.
    log_tail: u32,
    /// Of those cancels, how many answered `Cancelled`.
    log_tail_cancelled: u64,
    /// `tasks − cancelled + log_tail − log_tail_cancelled`: what
    /// `recovered_pending` must be.
    expected_pending: u64,
    /// `recovered_pending == expected_pending`.
    ok: bool,
}

/// Runs the bench and prints its report; fails the verdict if the reopened
/// engine did not recover exactly the tasks left.
pub fn run(args: &BenchArgs) -> anyhow::Result<Verdict> {
    if args.log_tail > args.tasks.div_ceil(2) || args.tasks.checked_add(args.log_tail).is_none() {
        return Err(super::usage_error(
            "bench",
            clap::error::ErrorKind::ValueValidation,
            format!(
                "--log-tail {} is more than the {} tasks with an even index (at most half of \
                 --tasks, rounded up)",
                args.log_tail,
                args.tasks.div_ceil(2)
            ),
        ));
    }
    args.durability.check("bench")?;
    let dir = BenchDir::prepare(args.dir.as_deref())?;
    let measured = measure(args, dir.path())?;
    drop(dir);
    let report = report(args, &measured);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if report.ok {
        Ok(Verdict::Pass)
    } else {
        errln!(
            "kairos bench: the reopened engine recovered {} pending tasks, expected {} \
             ({} scheduled - {} cancelled + {} - {} after the checkpoint)",
            report.recovered_pending,
            report.expected_pending,
            report.tasks,
            report.cancelled,
            report.log_tail,
            report.log_tail_cancelled
        );
        Ok(Verdict::Fail)
    }
}

/// Where the due times come from.
#[derive(Debug, Clone, Copy)]
enum Delays {
    /// The demo's order-timeout mix, in real time (time scale 1).
    Mix(Workload),
    /// A share of the tasks beyond the horizon, the rest within it.
    FarFraction { seed: u64, fraction: f64 },
}

impl Delays {
    fn new(args: &BenchArgs) -> Delays {
        match args.far_fraction {
            None => Delays::Mix(Workload {
                tasks: args.tasks,
                time_scale: 1.0,
                seed: args.seed,
            }),
            Some(fraction) => Delays::FarFraction {
                seed: args.seed,
                fraction,
            },
        }
    }

    /// The delay of task `index`: a function of the seed and the index alone.
    fn delay(&self, index: u32) -> Duration {
        match *self {
            Delays::Mix(workload) => workload.spec(index).delay,
            Delays::FarFraction { seed, fraction } => {
                let mut rng = SmallRng::seed_from_u64(workload::mix(seed ^ FAR_SALT, index));
                let far = rng.random::<f64>() < fraction;
                let (low, high) = if far {
                    (FAR_MIN, FAR_MAX)
                } else {
                    (NEAR_MIN, HORIZON_DEFAULT)
                };
                low + (high - low).mul_f64(rng.random::<f64>())
            }
        }
    }
}

/// Whether a task due after `delay` is beyond the horizon.
fn is_overflow(delay: Duration) -> bool {
    delay > HORIZON_DEFAULT
}

/// The key of task `index`: `order:<10 digits>:timeout`, without formatting
/// machinery (it is built between timed calls, 1 M times).
fn key(index: u32) -> [u8; KEY_BYTES] {
    let mut key = [0u8; KEY_BYTES];
    key[..KEY_PREFIX.len()].copy_from_slice(KEY_PREFIX);
    key[KEY_BYTES - KEY_SUFFIX.len()..].copy_from_slice(KEY_SUFFIX);
    let mut rest = index;
    for digit in key[KEY_PREFIX.len()..KEY_PREFIX.len() + KEY_DIGITS]
        .iter_mut()
        .rev()
    {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    key
}

/// What one run measured, before it is turned into a report.
#[derive(Debug)]
struct Measured {
    wheel_tasks: u64,
    overflow_tasks: u64,
    schedule_busy: Duration,
    cancels: u64,
    cancelled: u64,
    cancel_busy: Duration,
    rss_before: Option<u64>,
    rss_after_wheel: Option<u64>,
    rss_after_overflow: Option<u64>,
    rss_peak: Option<u64>,
    disk_bytes: u64,
    checkpoint: Duration,
    checkpoint_locked: Duration,
    checkpoint_longest_hold: Duration,
    checkpoint_hold_max: Duration,
    payloads_moved: u64,
    close: Duration,
    recovery: Duration,
    recovered_pending: u64,
    rss_before_reopen: Option<u64>,
    rss_after_reopen: Option<u64>,
    payloads_on_disk: u64,
    payload_bytes_in_memory: u64,
    far_tasks: u64,
    far_before_checkpoint: u64,
    log_tail_cancelled: u64,
}

/// Runs the load on `dir` and measures it.
fn measure(args: &BenchArgs, dir: &Path) -> anyhow::Result<Measured> {
    let config = config(args);
    let delays = Delays::new(args);
    let batch = args.batch as usize;
    let payload = vec![b'p'; args.payload_bytes as usize];
    let progress = Progress::new(u64::from(args.tasks), true);
    progress.phase("opening");
    let engine = Engine::open(dir, config.clone())
        .with_context(|| format!("cannot open an engine on {}", dir.display()))?;
    let mut keys: Vec<[u8; KEY_BYTES]> = Vec::with_capacity(batch);
    let mut due: Vec<Duration> = Vec::with_capacity(batch);

    progress.phase("scheduling tasks due within the horizon");
    let mut scheduler = Scheduler {
        engine: &engine,
        payload: &payload,
        progress: &progress,
        batch,
        done: 0,
        busy: Duration::ZERO,
    };
    let rss_before = rss_bytes("VmRSS:");
    let wheel_tasks = scheduler.pass(args.tasks, &delays, false, &mut keys, &mut due)?;
    let rss_after_wheel = rss_bytes("VmRSS:");
    progress.phase("scheduling tasks due beyond the horizon");
    let overflow_tasks = scheduler.pass(args.tasks, &delays, true, &mut keys, &mut due)?;
    let rss_after_overflow = rss_bytes("VmRSS:");
    let schedule_busy = scheduler.busy;

    let cancels = u64::from(args.tasks / 2);
    progress.restart(cancels, "cancelling every task with an odd index");
    let (cancelled, cancel_busy) = cancel_odd(&engine, args.tasks, batch, &mut keys, &progress)?;

    // Far tasks the background moves took out of the wheel before the
    // explicit checkpoint (the cancelled ones no longer counted).
    let far_before_checkpoint = engine.stats().far as u64;
    progress.phase("checkpoint");
    let (checkpoint, report) = take_checkpoint(&engine)?;
    let log_tail_cancelled = if args.log_tail > 0 {
        progress.phase("log tail: scheduling and cancelling after the checkpoint");
        log_tail(&mut scheduler, args, &delays, &mut keys, &mut due)?
    } else {
        0
    };
    // Background checkpoints while scheduling and cancelling included.
    let checkpoint_hold_max = engine.stats().checkpoint_hold_max;
    progress.phase("closing");
    let started = Instant::now();
    engine.shutdown().context("shutdown failed")?;
    let close = started.elapsed();
    drop(engine);
    let disk_bytes = dir_bytes(dir)?;

    progress.phase("reopening (in a fresh process)");
    let reopened = reopen_in_child(args, dir)?;
    let recovery = Duration::from_secs_f64(reopened.recovery_ms / 1000.0);
    let rss_before_reopen = reopened.rss_before;
    let rss_after_reopen = reopened.rss_after;
    let recovered_pending = reopened.pending;
    let _ = config;
    Ok(Measured {
        wheel_tasks,
        overflow_tasks,
        schedule_busy,
        cancels,
        cancelled,
        cancel_busy,
        rss_before,
        rss_after_wheel,
        rss_after_overflow,
        rss_peak: rss_bytes("VmHWM:"),
        disk_bytes,
        checkpoint,
        checkpoint_locked: report.locked,
        checkpoint_longest_hold: report.longest_hold,
        checkpoint_hold_max,
        payloads_moved: report.payloads_moved,
        close,
        recovery,
        recovered_pending,
        rss_before_reopen,
        rss_after_reopen,
        payloads_on_disk: reopened.payloads_on_disk,
        payload_bytes_in_memory: reopened.payload_bytes_in_memory,
        far_tasks: reopened.far,
        far_before_checkpoint,
        log_tail_cancelled,
    })
}

/// `--log-tail N`: schedules tasks `tasks..tasks + N` and cancels the
/// tasks with the N smallest even indices (all pending: only odd ones were
/// cancelled); returns how many of those cancels answered `Cancelled`.
fn log_tail(
    scheduler: &mut Scheduler<'_>,
    args: &BenchArgs,
    delays: &Delays,
    keys: &mut Vec<[u8; KEY_BYTES]>,
    due: &mut Vec<Duration>,
) -> anyhow::Result<u64> {
    for index in args.tasks..args.tasks + args.log_tail {
        keys.push(key(index));
        due.push(delays.delay(index));
        if keys.len() == scheduler.batch {
            scheduler.flush(keys, due)?;
        }
    }
    scheduler.flush(keys, due)?;
    let mut cancelled = 0u64;
    let evens: Vec<u32> = (0..args.log_tail).map(|i| i * 2).collect();
    for chunk in evens.chunks(scheduler.batch) {
        let chunk_keys: Vec<[u8; KEY_BYTES]> = chunk.iter().map(|&i| key(i)).collect();
        let refs: Vec<&[u8]> = chunk_keys.iter().map(|k| &k[..]).collect();
        let outcomes = scheduler
            .engine
            .cancel_many(&refs)
            .context("cancel_many failed")?;
        cancelled += outcomes
            .iter()
            .filter(|o| matches!(o, CancelOutcome::Cancelled { .. }))
            .count() as u64;
    }
    Ok(cancelled)
}

/// The engine's configuration for a run.
fn config(args: &BenchArgs) -> Config {
    let mut config = Config::default();
    config.durability = args.durability.durability();
    args.tuning.apply(&mut config);
    config.pending_tasks_max = config
        .pending_tasks_max
        .max(args.tasks as usize + args.log_tail as usize + 1);
    config
}

/// Schedules tasks in batches, timing only the `schedule_many` calls.
struct Scheduler<'a> {
    engine: &'a Engine,
    payload: &'a [u8],
    progress: &'a Progress,
    batch: usize,
    /// Tasks scheduled so far.
    done: u64,
    /// Time spent inside `schedule_many`.
    busy: Duration,
}

impl Scheduler<'_> {
    /// Schedules every task of `0..tasks` whose due time is beyond the
    /// horizon (`overflow`) or within it; returns how many.
    fn pass(
        &mut self,
        tasks: u32,
        delays: &Delays,
        overflow: bool,
        keys: &mut Vec<[u8; KEY_BYTES]>,
        due: &mut Vec<Duration>,
    ) -> anyhow::Result<u64> {
        let mut count = 0;
        for index in 0..tasks {
            let delay = delays.delay(index);
            if is_overflow(delay) != overflow {
                continue;
            }
            keys.push(key(index));
            due.push(delay);
            count += 1;
            if keys.len() == self.batch {
                self.flush(keys, due)?;
            }
        }
        self.flush(keys, due)?;
        Ok(count)
    }

    fn flush(
        &mut self,
        keys: &mut Vec<[u8; KEY_BYTES]>,
        due: &mut Vec<Duration>,
    ) -> anyhow::Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let batch: Vec<NewTask<'_>> = keys
            .iter()
            .zip(due.iter())
            .map(|(key, &delay)| NewTask {
                key,
                due: Due::After(delay),
                payload: self.payload,
            })
            .collect();
        let started = Instant::now();
        self.engine
            .schedule_many(&batch)
            .context("schedule_many failed")?;
        self.busy += started.elapsed();
        self.done += batch.len() as u64;
        self.progress.set(self.done);
        drop(batch);
        keys.clear();
        due.clear();
        Ok(())
    }
}

/// Cancels every task with an odd index by key, in batches; returns how many
/// cancels answered `Cancelled` and the time spent inside `cancel_many`.
fn cancel_odd(
    engine: &Engine,
    tasks: u32,
    batch: usize,
    keys: &mut Vec<[u8; KEY_BYTES]>,
    progress: &Progress,
) -> anyhow::Result<(u64, Duration)> {
    let (mut cancelled, mut done, mut busy) = (0u64, 0u64, Duration::ZERO);
    let mut index = 1u32;
    while index < tasks {
        keys.clear();
        while index < tasks && keys.len() < batch {
            keys.push(key(index));
            index = index.saturating_add(2);
        }
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let started = Instant::now();
        let outcomes = engine.cancel_many(&refs).context("cancel_many failed")?;
        busy += started.elapsed();
        cancelled += outcomes
            .iter()
            .filter(|o| matches!(o, CancelOutcome::Cancelled { .. }))
            .count() as u64;
        done += refs.len() as u64;
        progress.set(done);
    }
    keys.clear();
    Ok((cancelled, busy))
}

/// `kairos bench-reopen DIR`: reopens a data directory in this (fresh)
/// process and prints what the reopen cost as one JSON object. Run by
/// `kairos bench` so that the resident set measured is the reopened
/// engine's alone, not memory the first engine left to the allocator.
#[derive(Debug, Args)]
pub struct ReopenArgs {
    /// The data directory.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    #[command(flatten)]
    durability: DurabilityArgs,
    /// `Config::pending_tasks_max`.
    #[arg(long, value_name = "N")]
    pending_tasks_max: usize,
    #[command(flatten)]
    tuning: Tuning,
}

/// The engine settings `kairos bench` takes for side-by-side runs, and
/// passes on to the reopen in a child process.
#[derive(Args, Debug, Clone)]
struct Tuning {
    /// Tasks due within this window stay whole in the wheel's memory
    /// (`Config::resident_window`); later ones within the horizon leave it
    /// like far tasks. `off`: the whole horizon stays in memory. The engine
    /// raises a shorter window to the payload window (1m) and caps a longer
    /// one at the 18-day horizon (`Config::far_span`); the report gives the
    /// window used.
    #[arg(long, value_name = "D|off", default_value = "1m", value_parser = parse_window,
          allow_hyphen_values = true)]
    resident_window: ResidentWindow,
    /// `Config::relocate_far_bytes`: far tasks leave the wheel in the
    /// background once those scheduled since the last move take this much
    /// memory (a producer waits at twice this), for a side-by-side run.
    #[arg(long, value_name = "B", default_value_t = RELOCATE_FAR_BYTES_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..))]
    relocate_far_bytes: u64,
}

impl Tuning {
    /// Sets these fields of `config`.
    fn apply(&self, config: &mut Config) {
        config.resident_window = self.resident_window.0;
        config.relocate_far_bytes = self.relocate_far_bytes;
    }

    /// The same settings as command-line arguments, for the child process.
    fn to_args(&self) -> [String; 4] {
        [
            "--resident-window".into(),
            match self.resident_window.0 {
                Some(d) => format!("{}ms", d.as_millis()),
                None => "off".into(),
            },
            "--relocate-far-bytes".into(),
            self.relocate_far_bytes.to_string(),
        ]
    }
}

/// What a reopen cost, measured in a fresh process.
#[derive(Debug, Serialize, serde::Deserialize)]
struct Reopened {
    rss_before: Option<u64>,
    rss_after: Option<u64>,
    recovery_ms: f64,
    pending: u64,
    payloads_on_disk: u64,
    payload_bytes_in_memory: u64,
    /// Far tasks (beyond the far span, 20 B of memory each) after the open.
    far: u64,
}

/// Runs `kairos bench-reopen`.
pub fn run_reopen(args: &ReopenArgs) -> anyhow::Result<Verdict> {
    let mut config = Config::default();
    config.durability = args.durability.durability();
    config.pending_tasks_max = args.pending_tasks_max;
    args.tuning.apply(&mut config);
    let rss_before = rss_bytes("VmRSS:");
    let started = Instant::now();
    let engine = Engine::open(&args.dir, config)
        .with_context(|| format!("cannot reopen the engine on {}", args.dir.display()))?;
    let recovery_ms = millis(started.elapsed());
    let rss_after = rss_bytes("VmRSS:");
    let stats = engine.stats();
    let out = Reopened {
        rss_before,
        rss_after,
        recovery_ms,
        pending: engine.recovery().pending as u64,
        payloads_on_disk: stats.payloads_on_disk as u64,
        payload_bytes_in_memory: stats.payload_bytes_in_memory as u64,
        far: stats.far as u64,
    };
    engine
        .shutdown()
        .context("shutdown of the reopened engine failed")?;
    outln!("{}", serde_json::to_string(&out)?);
    Ok(Verdict::Pass)
}

/// Reopens `dir` in a child process (`kairos bench-reopen`) and reads its
/// measurements.
fn reopen_in_child(args: &BenchArgs, dir: &Path) -> anyhow::Result<Reopened> {
    let exe = std::env::current_exe().context("cannot find the kairos executable")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("bench-reopen")
        .arg(dir)
        .arg("--pending-tasks-max")
        .arg(config(args).pending_tasks_max.to_string())
        .arg("--durability")
        .arg(format!("{:?}", args.durability.mode).to_lowercase())
        .args(
            (args.durability.mode == DurabilityMode::Interval)
                .then(|| {
                    [
                        "--interval-ms".to_string(),
                        args.durability.interval_ms().to_string(),
                    ]
                })
                .into_iter()
                .flatten(),
        )
        .args(args.tuning.to_args());
    cmd.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().context("cannot run kairos bench-reopen")?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    // Held where an interruption's handler can end it (`on_signal`) while its output is read.
    on_signal::child_started(child);
    let stderr_reader = std::thread::Builder::new()
        .name("bench-reopen-stderr".into())
        .spawn(move || read_all(stderr));
    let stdout = read_all(stdout);
    let stderr = match stderr_reader {
        Ok(reader) => reader.join().unwrap_or_default(),
        Err(_) => Vec::new(),
    };
    let status = on_signal::wait_child().context("cannot run kairos bench-reopen")?;
    if !status.success() {
        bail!(
            "the reopen failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        );
    }
    serde_json::from_slice(&stdout).context("cannot read what kairos bench-reopen printed")
}

/// Everything left to read from a child's pipe (what was read if reading fails).
fn read_all(pipe: Option<impl std::io::Read>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        let _ = pipe.read_to_end(&mut bytes);
    }
    bytes
}

/// Takes a checkpoint of `engine`; returns how long it took and its report.
fn take_checkpoint(engine: &Engine) -> anyhow::Result<(Duration, CheckpointReport)> {
    let started = Instant::now();
    let report = engine.checkpoint().context("checkpoint failed")?;
    Ok((started.elapsed(), report))
}

/// A `/proc/self/status` figure in bytes (`VmRSS:`, `VmHWM:`); `None` where
/// there is no such file (not Linux) or no such line.
fn rss_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// RSS growth per task, bytes; `None` if there are no tasks or no figures.
fn growth_per_task(before: Option<u64>, after: Option<u64>, tasks: u64) -> Option<f64> {
    let (before, after) = (before?, after?);
    (tasks > 0).then(|| round_to(((after as f64) - (before as f64)) / tasks as f64, 1))
}

/// Sum of the sizes of the files under `dir`, recursively (links not followed).
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let meta = std::fs::symlink_metadata(entry.path())
            .with_context(|| format!("cannot inspect {}", entry.path().display()))?;
        if meta.is_dir() {
            total += dir_bytes(&entry.path())?;
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

/// The data directory of a run: the one given (created if missing, refused
/// unless empty; kept) or a fresh temporary one (removed on drop).
#[derive(Debug)]
struct BenchDir {
    path: PathBuf,
    temporary: bool,
}

impl BenchDir {
    fn prepare(given: Option<&Path>) -> anyhow::Result<BenchDir> {
        let Some(dir) = given else {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let path = std::env::temp_dir()
                .join(format!("kairos-bench-{}-{nanos:09}", std::process::id()));
            // `create_dir`, not `create_dir_all`: fails rather than reuse.
            std::fs::create_dir(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            on_signal::remove_on_signal(&path);
            return Ok(BenchDir {
                path,
                temporary: true,
            });
        };
        // Through a symbolic link: `--dir` may name a directory by a link to it.
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {
                let mut entries = std::fs::read_dir(dir)
                    .with_context(|| format!("cannot list {}", dir.display()))?;
                if entries.next().is_some() {
                    bail!(
                        "refusing to use {}: it is not empty (the bench needs a fresh data \
                         directory; omit --dir to use a temporary one)",
                        dir.display()
                    );
                }
            }
            Ok(_) => bail!("{} exists and is not a directory", dir.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot inspect {}", dir.display()));
            }
        }
        Ok(BenchDir {
            path: dir.to_path_buf(),
            temporary: false,
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BenchDir {
    /// Removes a temporary directory (after a failure too).
    fn drop(&mut self) {
        if self.temporary {
            // Removed under the handler's lock: an interruption meanwhile waits for the removal
            // to end, then only exits.
            if let Err(e) = on_signal::remove_dir(&self.path) {
                errln!(
                    "kairos bench: warning: cannot remove {}: {e}",
                    self.path.display()
                );
            }
        }
    }
}

/// Removing the temporary data directory when the bench is interrupted (SIGINT, SIGTERM,
/// SIGHUP), which `Drop` does not see: the handler (a thread of `ctrlc`'s) kills the reopen's
/// child process if one runs, removes the directory and exits with status 130.
mod on_signal {
    use std::path::{Path, PathBuf};
    use std::process::{Child, ExitStatus};
    use std::sync::{Mutex, MutexGuard, PoisonError};
    use std::time::Duration;

    /// What to clean up.
    struct State {
        /// The temporary data directory.
        dir: Option<PathBuf>,
        /// The reopen's child process, until it has been waited for.
        child: Option<Child>,
    }

    static STATE: Mutex<State> = Mutex::new(State {
        dir: None,
        child: None,
    });

    /// Tries at removing the directory, which the engine's threads may still be writing to.
    const REMOVE_TRIES: u32 = 50;

    fn state() -> MutexGuard<'static, State> {
        STATE.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs the handler for the temporary directory `dir`; if it cannot be installed, a
    /// warning says that an interrupted run leaves the directory behind.
    pub(super) fn remove_on_signal(dir: &Path) {
        state().dir = Some(dir.to_path_buf());
        if let Err(e) = ctrlc::set_handler(on_signal) {
            errln!(
                "kairos bench: warning: cannot handle interruptions ({e}): an interrupted run \
                 leaves {} behind",
                dir.display()
            );
        }
    }

    /// Removes the temporary directory for its owner (`BenchDir`'s drop), holding the
    /// handler's state meanwhile: an interruption during the removal waits for it to end, and
    /// one after it only exits.
    pub(super) fn remove_dir(dir: &Path) -> std::io::Result<()> {
        let mut state = state();
        state.dir = None;
        std::fs::remove_dir_all(dir)
    }

    /// Holds the reopen's child process (its pipes taken) until [`wait_child`].
    pub(super) fn child_started(child: Child) {
        state().child = Some(child);
    }

    /// Waits for the child process given to [`child_started`] (once its output is read).
    pub(super) fn wait_child() -> std::io::Result<ExitStatus> {
        // Not under the lock: the handler, if it runs meanwhile, has nothing left to kill (the
        // child closed its output: it is ending) but still removes the directory.
        let child = state().child.take();
        match child {
            Some(mut child) => child.wait(),
            None => Err(std::io::Error::other("the child process is gone")),
        }
    }

    fn on_signal() {
        let mut state = state();
        if let Some(child) = state.child.as_mut() {
            // It may be writing to the directory (its open creates `checkpoint/` if missing).
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &state.dir {
            // The engine's threads may add files while it goes.
            let mut result = Ok(());
            for _ in 0..REMOVE_TRIES {
                result = std::fs::remove_dir_all(dir);
                if result.is_ok() || !dir.exists() {
                    result = Ok(());
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            match result {
                Ok(()) => errln!(
                    "kairos bench: interrupted; removed the temporary directory {}",
                    dir.display()
                ),
                Err(e) => errln!(
                    "kairos bench: interrupted; cannot remove the temporary directory {}: {e}",
                    dir.display()
                ),
            }
        }
        std::process::exit(130);
    }
}

/// A duration in whole milliseconds.
fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A window of `ms` milliseconds for the table: in days, seconds or milliseconds, whichever
/// is exact first.
fn window_text(ms: u64) -> String {
    match ms {
        0 => "0 s".into(),
        ms if ms.is_multiple_of(DAY_S * 1000) => format!("{} d", ms / (DAY_S * 1000)),
        ms if ms.is_multiple_of(1000) => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

/// Assembles the report.
fn report(args: &BenchArgs, m: &Measured) -> Report {
    let expected_pending =
        u64::from(args.tasks) - m.cancelled + u64::from(args.log_tail) - m.log_tail_cancelled;
    let per_sec = |n: u64, busy: Duration| {
        (n > 0 && !busy.is_zero()).then(|| (n as f64 / busy.as_secs_f64()).round())
    };
    Report {
        tasks: args.tasks,
        far_fraction: args.far_fraction,
        wheel_tasks: m.wheel_tasks,
        overflow_tasks: m.overflow_tasks,
        horizon_days: HORIZON_DEFAULT.as_secs() / DAY_S,
        // The window the engine uses (`Config::far_span`): at least the payload window, at
        // most the horizon.
        resident_window_ms: args
            .tuning
            .resident_window
            .0
            .and_then(|_| config(args).far_span())
            .map(duration_ms),
        resident_window_given_ms: args.tuning.resident_window.0.map(duration_ms),
        relocate_far_bytes: args.tuning.relocate_far_bytes,
        payload_bytes: args.payload_bytes,
        key_bytes: KEY_BYTES,
        durability: format!("{:?}", args.durability.mode).to_lowercase(),
        interval_ms: (args.durability.mode == DurabilityMode::Interval)
            .then(|| args.durability.interval_ms()),
        batch: args.batch,
        seed: args.seed,
        dir: args.dir.as_ref().map(|d| d.display().to_string()),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        schedule_ms: millis(m.schedule_busy),
        schedule_per_sec: per_sec(u64::from(args.tasks), m.schedule_busy).unwrap_or(0.0),
        cancelled: m.cancelled,
        cancel_ms: millis(m.cancel_busy),
        cancel_per_sec: per_sec(m.cancels, m.cancel_busy),
        rss_bytes: m.rss_peak,
        ram_bytes_per_wheel_task: growth_per_task(m.rss_before, m.rss_after_wheel, m.wheel_tasks),
        ram_bytes_per_overflow_task: growth_per_task(
            m.rss_after_wheel,
            m.rss_after_overflow,
            m.overflow_tasks,
        ),
        disk_bytes: m.disk_bytes,
        checkpoint_ms: millis(m.checkpoint),
        checkpoint_locked_ms: millis(m.checkpoint_locked),
        checkpoint_longest_hold_ms: millis(m.checkpoint_longest_hold),
        checkpoint_hold_max_ms: millis(m.checkpoint_hold_max),
        payloads_moved: m.payloads_moved,
        payloads_on_disk: m.payloads_on_disk,
        payload_bytes_in_memory: m.payload_bytes_in_memory,
        far_tasks_before_checkpoint: m.far_before_checkpoint,
        far_tasks_after_recovery: m.far_tasks,
        ram_bytes_per_task_after_recovery: growth_per_task(
            m.rss_before_reopen,
            m.rss_after_reopen,
            m.recovered_pending,
        ),
        close_ms: millis(m.close),
        recovery_ms: millis(m.recovery),
        recovered_pending: m.recovered_pending,
        log_tail: args.log_tail,
        log_tail_cancelled: m.log_tail_cancelled,
        expected_pending,
        ok: m.recovered_pending == expected_pending,
    }
}

/// A duration in ms, to the µs.
fn millis(d: Duration) -> f64 {
    round_to(d.as_secs_f64() * 1000.0, 3)
}

/// `x` rounded to `decimals` decimal places.
fn round_to(x: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (x * scale).round() / scale
}

/// A rate for reading: `2.07 M/s`, `812.3 k/s`, `950 /s`.
fn rate_text(per_sec: f64) -> String {
    if per_sec >= 1e6 {
        format!("{:.2} M tasks/s", per_sec / 1e6)
    } else if per_sec >= 1e3 {
        format!("{:.1} k tasks/s", per_sec / 1e3)
    } else {
        format!("{per_sec:.0} tasks/s")
    }
}

/// The readable report, for a terminal.
fn print_table(r: &Report) {
    let delays = match r.far_fraction {
        None => {
            "the order-timeout delay mix (45 % <= 30 min, 35 % <= 7 d, 20 % <= 30 d)".to_string()
        }
        Some(f) => format!("{f} of them due beyond the horizon (19 d - 1 y), the rest 1 h - 18 d"),
    };
    let bytes_per_task = |x: Option<f64>, n: u64| match x {
        Some(b) => format!("{b:.1} B per task ({n} tasks)"),
        None if n == 0 => "n/a (no such task)".to_string(),
        None => "n/a (no /proc/self/status)".to_string(),
    };
    outln!(
        "kairos bench: {} tasks, {delays}; {}-byte keys, {}-byte payloads; durability {}{}; \
         batches of {}; seed {}; {} cores",
        r.tasks,
        r.key_bytes,
        r.payload_bytes,
        r.durability,
        r.interval_ms
            .map_or(String::new(), |ms| format!(" ({ms} ms)")),
        r.batch,
        r.seed,
        r.cores,
    );
    let row = |label: &str, value: String| outln!("  {label:<24} {value}");
    row(
        "data directory",
        r.dir
            .clone()
            .unwrap_or_else(|| "temporary (removed)".to_string()),
    );
    row(
        "tasks",
        format!(
            "{} due within the {}-day horizon (wheel), {} beyond it (overflow)",
            r.wheel_tasks, r.horizon_days, r.overflow_tasks
        ),
    );
    row(
        "resident window",
        match (r.resident_window_ms, r.resident_window_given_ms) {
            (Some(ms), given) => format!(
                "{}: tasks due later leave the wheel's memory (far){}",
                window_text(ms),
                match given {
                    Some(given) if given < ms => format!(
                        " (--resident-window {} raised to the payload window)",
                        window_text(given)
                    ),
                    Some(given) if given > ms => format!(
                        " (--resident-window {} capped at the {}-day horizon)",
                        window_text(given),
                        r.horizon_days
                    ),
                    _ => String::new(),
                }
            ),
            (None, _) => "off: the whole horizon stays in the wheel's memory".into(),
        },
    );
    row(
        "far moves",
        format!(
            "every {} of far tasks in memory (relocate_far_bytes)",
            if r.relocate_far_bytes.is_multiple_of(1 << 20) {
                format!("{} MiB", r.relocate_far_bytes >> 20)
            } else {
                format!("{} bytes", r.relocate_far_bytes)
            }
        ),
    );
    row(
        "schedule",
        format!(
            "{} ({} tasks, {:.1} ms inside schedule_many)",
            rate_text(r.schedule_per_sec),
            r.tasks,
            r.schedule_ms
        ),
    );
    row(
        "cancel",
        match r.cancel_per_sec {
            Some(rate) => format!(
                "{} ({} cancelled, {:.1} ms inside cancel_many)",
                rate_text(rate),
                r.cancelled,
                r.cancel_ms
            ),
            None => "n/a (no task to cancel)".to_string(),
        },
    );
    row(
        "peak RSS",
        r.rss_bytes
            .map_or("n/a (no /proc/self/status)".to_string(), |b| {
                format!("{:.1} MiB ({b} bytes)", b as f64 / (1024.0 * 1024.0))
            }),
    );
    row(
        "RAM per wheel task",
        bytes_per_task(r.ram_bytes_per_wheel_task, r.wheel_tasks),
    );
    row(
        "RAM per overflow task",
        bytes_per_task(r.ram_bytes_per_overflow_task, r.overflow_tasks),
    );
    row(
        "disk",
        format!(
            "{:.1} MiB ({} bytes) after checkpoint and close",
            r.disk_bytes as f64 / (1024.0 * 1024.0),
            r.disk_bytes
        ),
    );
    row(
        "checkpoint",
        format!(
            "{:.1} ms, {:.1} ms of it holding the engine's lock (longest hold {:.1} ms; {} \
             payloads moved to disk)",
            r.checkpoint_ms, r.checkpoint_locked_ms, r.checkpoint_longest_hold_ms, r.payloads_moved
        ),
    );
    if r.log_tail > 0 {
        row(
            "log tail",
            format!(
                "{} scheduled and {} cancelled after the checkpoint (replayed by the reopen)",
                r.log_tail, r.log_tail_cancelled
            ),
        );
    }
    row("close", format!("{:.1} ms", r.close_ms));
    row("recovery (reopen)", format!("{:.1} ms", r.recovery_ms));
    row(
        "far before checkpoint",
        format!(
            "{} tasks out of the wheel by background moves",
            r.far_tasks_before_checkpoint
        ),
    );
    row(
        "after the reopen",
        format!(
            "{} far tasks, {} payloads on disk, {} payload bytes in memory, RSS growth {}",
            r.far_tasks_after_recovery,
            r.payloads_on_disk,
            r.payload_bytes_in_memory,
            r.ram_bytes_per_task_after_recovery
                .map_or("unknown".to_string(), |b| format!("{b:.1} B per task"))
        ),
    );
    row(
        "recovered pending",
        format!(
            "{} (expected {} = {} - {} cancelled + {} - {} after the checkpoint): {}",
            r.recovered_pending,
            r.expected_pending,
            r.tasks,
            r.cancelled,
            r.log_tail,
            r.log_tail_cancelled,
            if r.ok { "ok" } else { "MISMATCH" }
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_24_bytes_with_the_index() {
        assert_eq!(&key(42), b"order:0000000042:timeout");
        assert_eq!(&key(u32::MAX), b"order:4294967295:timeout");
    }

    #[test]
    fn far_fraction_delays_fall_in_their_ranges() {
        let delays = Delays::FarFraction {
            seed: 7,
            fraction: 0.8,
        };
        let far = (0..10_000)
            .map(|i| delays.delay(i))
            .inspect(|&d| {
                assert!((NEAR_MIN..HORIZON_DEFAULT).contains(&d) || (FAR_MIN..FAR_MAX).contains(&d))
            })
            .filter(|&d| is_overflow(d))
            .count();
        assert!((7_700..=8_300).contains(&far), "{far} far of 10 000");
    }
}
