//! `kairos demo`: the order-timeout workload of `DESIGN.md` on a real data
//! directory, with a clean shutdown and reopen midway, checked task by task.
//!
//! Threads: producers schedule every order's timeout in batches; a canceller
//! cancels the paid orders at planned moments; per engine generation,
//! receivers take due tasks (timestamping them for lateness) and ackers
//! acknowledge them. The main thread restarts the engine halfway through
//! the time span and waits until every task is delivered or cancelled;
//! with `--horizon` it also takes a checkpoint every half horizon, so that
//! payloads go to overflow files and come back (`overflow`).

mod canceller;
mod consumers;
mod context;
mod overflow;
mod producer;
// Shared with `kairos bench`.
pub(super) mod progress;
mod report;
mod session;
mod tracker;
pub(super) mod workload;

use super::{parse_duration_or, DurabilityArgs, DurabilityMode, Verdict};
use anyhow::{bail, ensure, Context as _};
use clap::Args;
use kairos::Config;
use kairos_wal::{FsStorage, Storage as _};
use report::{Lateness, Report};
use session::{Findings, Settings};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use workload::Workload;

/// By default orders arrive evenly over this share of the time span.
const ARRIVAL_SHARE_OF_SPAN: f64 = 0.1;

/// Run the order-timeout workload on a real data directory, restarting the
/// engine midway, and check that every task was cancelled, acked or
/// dead-lettered, and never delivered twice for the same attempt.
#[derive(Debug, Args)]
#[command(long_about = "\
Run the order-timeout workload on a real data directory, restarting the engine midway, and \
check that every task was cancelled, acked or dead-lettered, and never delivered twice for the \
same attempt.

Orders arrive over the first tenth of the time span (see --rate) and are scheduled in batches \
with timeouts: 45 % due within 30 minutes, 35 % within 7 days, 20 % within 30 days, divided by \
the time scale (by default 86 400, so 30 days take 30 seconds). Paid orders (65 % of the short \
ones, 30 % of the others) are cancelled at a random moment before their timeout. Consumers \
receive and ack the rest, at least once, each delivery under a lease (--lease-ms): 1 % of the \
tasks fail their first delivery (nacked, retried --retry-ms later), 0.1 % fail every delivery \
and end as dead letters after 3 attempts (the engine's default max_attempts; list them \
afterwards with `kairos dead-letters list DIR`), and one consumer \"crashes\" holding \
--crash-holding deliveries, which come back when their leases expire. Halfway through the time \
span the engine is shut down and reopened on the same directory; the run ends when every task is \
finished (about 35 s with the defaults).

With --horizon DURATION (real time, already scaled: with the default time scale `2s` is two \
simulated days) the engine keeps in memory only the payloads of tasks due within the horizon \
(Config::payload_window): the demo takes a checkpoint every half horizon, each moving the \
payloads of waiting tasks due later to an overflow file on disk, and the engine reads them back \
as they come due (its prefetcher, or the consumer receiving the task). The report adds the \
checkpoints taken, the payloads moved, the most on disk at once and overflow_promoted, the \
payloads read back. Without --horizon the engine's defaults apply — a one-minute window, \
checkpoints every 10 minutes or 256 MiB of log — so a default run moves little or nothing to \
disk.

Each run marks its directory with a DEMO file at its top. If DIR exists it is emptied first, so \
every run starts fresh — but only if it is empty or a demo's: a directory without the DEMO file \
(an application's data directory, say) is refused rather than removed, as is one holding \
anything a Kairos data directory does not (a file other than DEMO, LOCK, wal/, checkpoint/ and \
overflow/ with their own files), one an engine has open, and one whose log has records logged \
after the demo finished (the DEMO file records its last LSN then: something else has used \
it). A run cut short (Ctrl-C, a kill) — while it runs, or while it empties the last run's \
directory, which keeps its DEMO file to the end — leaves a directory the next run empties (and \
says so). Nothing is removed before every \
argument checks and --samples-csv is created.

Exit status 1 if an invariant breaks: a task lost (neither cancelled, acked nor dead-lettered); \
a duplicate (an attempt number delivered twice, or a delivery after a successful ack — a \
redelivery after a nack, a lease expiry or the restart carries the next attempt number and is \
no duplicate); an attempt number skipped; a delivery after a cancel that promised none \
(Cancelled, or AlreadyDelivered for a later attempt); an early delivery; a delivery or a dead \
letter whose payload is not the one scheduled; p99 lateness above \
--max-p99-ms when given (otherwise a p99 above 10 ms is only a warning); or the reopened engine \
not recovering exactly the tasks that were pending at shutdown; or the engine's own running \
totals (Stats, summed over both opens) disagreeing with what the run saw: its deliveries with the \
receipts, its nacks with the nacks it answered, the tasks it dead-lettered with the dead letters \
kept. A directory open in another engine is never removed.")]
pub struct DemoArgs {
    /// Data directory (emptied first if an earlier demo made it; marked with a DEMO file).
    #[arg(long, value_name = "DIR", default_value = "./kairos-data")]
    dir: PathBuf,
    /// Orders (tasks) to schedule, 1 to 50 000 000.
    #[arg(long, value_name = "N", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=50_000_000))]
    tasks: u32,
    /// Simulated seconds per real second, 1 to 1e9; 86 400 makes 30 days last 30 s.
    #[arg(long, value_name = "X", default_value_t = 86_400.0, value_parser = parse_time_scale)]
    time_scale: f64,
    /// Log segment roll size, bytes (at least 4096). The demo's default, 8 MiB,
    /// is smaller than the engine's (64 MiB) so that a default run rolls and
    /// seals a few segments (~38 MB of log for 100 000 tasks).
    #[arg(long, value_name = "B", default_value_t = DEMO_SEGMENT_BYTES,
          value_parser = clap::value_parser!(u64).range(kairos_wal::SEGMENT_BYTES_MIN..))]
    segment_bytes: u64,
    #[command(flatten)]
    durability: DurabilityArgs,
    /// Print one JSON object on stdout instead of the summary.
    #[arg(long)]
    json: bool,
    /// Seed of the workload (random by default; reported, so a run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Orders arriving per second, spread evenly [default: all tasks over the
    /// first tenth of the time span, 3 s with the defaults]; 0 schedules as
    /// fast as the engine takes them (a burst).
    #[arg(long, value_name = "N", value_parser = parse_rate)]
    rate: Option<f64>,
    /// Producer threads.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    producers: u16,
    /// Tasks per `schedule_many` call (one log write each).
    #[arg(long, value_name = "N", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// Receiver threads per engine generation.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    consumers: u16,
    /// Acker threads per engine generation. Each acks whatever is waiting
    /// with one `ack_many` (one log write; under `sync`, one fdatasync).
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    ackers: u16,
    /// Lease of each delivery, ms: how long a consumer may hold it unanswered
    /// before it is delivered again. Real time, not scaled. The consumers
    /// answer within milliseconds (an ack waits for one fdatasync under
    /// `sync`), so the default 5 s is over a thousand times that and no
    /// healthy delivery expires; the crashed consumer's deliveries come back
    /// after it plus the retry backoff (about 1 s), long before the restart
    /// at 15 s with the default time scale.
    #[arg(long, value_name = "MS", default_value_t = DEMO_LEASE_MS,
          value_parser = clap::value_parser!(u64).range(1..=LEASE_MAX_MS))]
    lease_ms: u64,
    /// Retry delay of each nack, ms (real time; at most a day).
    #[arg(long, value_name = "MS", default_value_t = 50,
          value_parser = clap::value_parser!(u64).range(0..=DEMO_WAIT_MAX_MS))]
    retry_ms: u64,
    /// Deliveries the crashing consumer holds, never answering, before it
    /// stops (only unpaid orders, so each comes back); 0 for no crash.
    #[arg(long, value_name = "N", default_value_t = 20)]
    crash_holding: usize,
    /// Pause between shutdown and reopen, ms (at most a day).
    #[arg(long, value_name = "MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(0..=DEMO_WAIT_MAX_MS))]
    downtime_ms: u64,
    /// Also write every receipt to FILE as CSV (due_ms, received_us, attempt,
    /// generation), for plotting lateness over time. FILE must be outside
    /// DIR, which each run replaces.
    #[arg(long, value_name = "FILE")]
    samples_csv: Option<PathBuf>,
    /// Largest acceptable p99 lateness, ms. Given, a p99 above it fails the
    /// run; by default (10 ms) it only warns, since lateness depends on how
    /// busy the machine is. An unpaced burst (`--rate 0`) on a small machine
    /// may need more.
    #[arg(long, value_name = "MS", value_parser = parse_max_p99_ms)]
    max_p99_ms: Option<f64>,
    /// Payload window, in real time (already scaled: with the default time
    /// scale, `2s` is two simulated days), e.g. `2s`, `500ms`: payloads of
    /// tasks due later than this move to overflow files on disk, and the
    /// demo takes a checkpoint every half horizon so that they do. Without
    /// it the engine's defaults apply (a one-minute window, checkpoints
    /// every 10 minutes or 256 MiB of log), and a 35-s demo moves little or
    /// nothing to disk.
    #[arg(long, value_name = "DURATION", value_parser = parse_horizon, allow_hyphen_values = true)]
    horizon: Option<Duration>,
}

/// Default `--lease-ms`: 5 s.
const DEMO_LEASE_MS: u64 = 5_000;

/// Largest `--lease-ms`: the engine's `LEASE_MAX`.
const LEASE_MAX_MS: u64 = kairos::config::LEASE_MAX.as_secs() * 1000;

/// Default `--segment-bytes`: 8 MiB.
const DEMO_SEGMENT_BYTES: u64 = 8 * 1024 * 1024;

/// The p99 lateness aim, ms, when `--max-p99-ms` is not given.
const DEFAULT_MAX_P99_MS: f64 = 10.0;

/// Runs the demo and prints its report; fails the verdict if an invariant
/// broke.
pub fn run(args: &DemoArgs) -> anyhow::Result<Verdict> {
    args.durability.check("demo")?;
    let settings = settings(args);
    // A configuration the engine would refuse leaves the last run's directory alone.
    settings.config.check()?;
    let samples_inside = |path: &Path| {
        super::usage_error(
            "demo",
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "--samples-csv {} is inside --dir {}, which the next run removes: write it \
                 elsewhere",
                path.display(),
                settings.dir.display()
            ),
        )
    };
    if let Some(path) = &args.samples_csv {
        if real_path(path)?.starts_with(real_path(&settings.dir)?) {
            return Err(samples_inside(path));
        }
    }
    // Everything that can refuse or fail comes before anything is removed: the last run's
    // directory checked and locked, the samples file created.
    let previous = PreviousRun::check(&settings.dir)?;
    let samples = match &args.samples_csv {
        Some(path) => {
            let file = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            // Once it exists every link on its way resolves: a dangling link into --dir
            // (which `real_path` cannot follow before) would have the removal below take it.
            let created = std::fs::canonicalize(path)
                .with_context(|| format!("cannot resolve {}", path.display()))?;
            if created.starts_with(real_path(&settings.dir)?) {
                drop(file);
                let _ = std::fs::remove_file(&created);
                return Err(samples_inside(path));
            }
            Some((path, file))
        }
        None => None,
    };
    let cut_short = previous.cut_short;
    if previous.remove()? && !args.json {
        outln!(
            "removed the previous data directory {}{}",
            settings.dir.display(),
            if cut_short {
                " (left by a demo that did not finish)"
            } else {
                ""
            }
        );
    }
    mark_as_demo(&settings.dir)?;
    let findings = session::run(&settings)?;
    mark_finished(&settings.dir)?;
    if let Some((path, file)) = samples {
        write_samples(path, file, &findings.samples)?;
    }
    let report = report(args, &settings, &findings);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!("{}", report.summary().trim_end());
    }
    for violation in &report.violations {
        errln!("kairos demo: invariant broken: {violation}");
    }
    for warning in &report.warnings {
        errln!("kairos demo: warning: {warning}");
    }
    Ok(if report.ok {
        Verdict::Pass
    } else {
        Verdict::Fail
    })
}

/// The run's settings from the command line (the seed drawn if not given).
fn settings(args: &DemoArgs) -> Settings {
    let mut config = Config::default();
    config.durability = args.durability.durability();
    config.segment_bytes = args.segment_bytes;
    config.lease = Duration::from_millis(args.lease_ms);
    if let Some(horizon) = args.horizon {
        config.payload_window = Some(horizon);
    }
    let workload = Workload {
        tasks: args.tasks,
        time_scale: args.time_scale,
        seed: args.seed.unwrap_or_else(rand::random),
    };
    Settings {
        dir: args.dir.clone(),
        workload,
        config,
        producers: usize::from(args.producers),
        batch: args.batch as usize,
        rate: arrival_rate(args, &workload),
        consumers: usize::from(args.consumers),
        ackers: usize::from(args.ackers),
        crash_holding: args.crash_holding,
        retry_after: Duration::from_millis(args.retry_ms),
        downtime: Duration::from_millis(args.downtime_ms),
        progress: !args.json,
        checkpoint_every: args.horizon.map(overflow::checkpoint_every),
    }
}

/// A horizon: a positive duration (see [`parse_duration`]) up to the
/// engine's horizon ([`kairos::config::HORIZON_DEFAULT`], 18 days), which
/// the payload window it sets must not exceed.
fn parse_horizon(s: &str) -> Result<Duration, String> {
    const POSITIVE: &str = "use whole numbers with units ms, s, m, h, d, more than 0 (e.g. 2s, \
                            500ms)";
    match parse_duration_or(s, POSITIVE)? {
        Duration::ZERO => Err(format!("{s:?} is no horizon: {POSITIVE}")),
        horizon if horizon > kairos::config::HORIZON_DEFAULT => Err(format!(
            "must be at most the engine's horizon, {} days",
            kairos::config::HORIZON_DEFAULT.as_secs() / 86_400
        )),
        horizon => Ok(horizon),
    }
}

/// Largest `--time-scale`: 30 days then last 2.6 ms, about the engine's
/// tick; beyond it the whole run, restart included, would fit in a few ticks
/// and test nothing.
const TIME_SCALE_MAX: f64 = 1e9;

/// A time scale: a number in 1..=[`TIME_SCALE_MAX`].
fn parse_time_scale(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (1.0..=TIME_SCALE_MAX).contains(&x) {
        Ok(x)
    } else {
        Err(format!("must be a number from 1 to {TIME_SCALE_MAX:e}"))
    }
}

/// Orders per second: `--rate`, or every task over the first tenth of the
/// span; `None` (unpaced) for `--rate 0`.
fn arrival_rate(args: &DemoArgs, workload: &Workload) -> Option<f64> {
    let rate = args.rate.unwrap_or_else(|| {
        f64::from(workload.tasks) / (workload.span().as_secs_f64() * ARRIVAL_SHARE_OF_SPAN)
    });
    (rate > 0.0 && rate.is_finite()).then_some(rate)
}

/// The longest `--retry-ms` and `--downtime-ms`: a day (the demo runs until every
/// task is delivered or cancelled, so a longer wait only stalls it).
const DEMO_WAIT_MAX_MS: u64 = 86_400_000;

/// The slowest `--rate`, orders per second: one order every 1 000 s.
const RATE_MIN: f64 = 0.001;

/// An arrival rate: 0 (unpaced) or a finite number ≥ [`RATE_MIN`].
fn parse_rate(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if x == 0.0 || (x.is_finite() && x >= RATE_MIN) {
        Ok(x)
    } else {
        Err(format!(
            "must be 0 (unpaced) or a number from {RATE_MIN} up"
        ))
    }
}

/// `--max-p99-ms`: a finite number ≥ 0.
fn parse_max_p99_ms(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        Err("must be a number ≥ 0".into())
    }
}

/// `path` made absolute with its symbolic links resolved as far as it exists (its missing
/// tail appended as written), so that a path inside `--dir` is told as inside whichever link
/// either one goes through.
fn real_path(path: &Path) -> anyhow::Result<PathBuf> {
    let absolute =
        std::path::absolute(path).with_context(|| format!("cannot resolve {}", path.display()))?;
    let mut existing = absolute.as_path();
    let mut tail = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            return Ok(tail.iter().rev().fold(real, |p, part| p.join(part)));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_os_string());
                existing = parent;
            }
            _ => return Ok(absolute),
        }
    }
}

/// The file `kairos demo` writes at the top of each data directory it uses, so that a later
/// run removes only a demo's directory, never an application's (whose files are the same).
pub(super) const DEMO_MARKER: &str = "DEMO";
/// [`DEMO_MARKER`] being rewritten ([`write_marker`]), left only by a kill in between.
const DEMO_MARKER_TMP: &str = "DEMO.tmp";

/// What the marker file says to whoever finds it.
const DEMO_MARKER_TEXT: &str = "This data directory was made by `kairos demo`. The next \
`kairos demo --dir` naming it removes its contents, unless records were logged after the demo \
finished (at the LSN below, once it has); without this file it is refused.\n";

/// The last run's data directory at `--dir`, checked and locked, not yet removed.
struct PreviousRun {
    dir: PathBuf,
    /// Whether there is anything to remove.
    present: bool,
    /// Whether it is a run's that did not finish (killed, or failed): its marker records no
    /// last LSN.
    cut_short: bool,
    /// The engine's locks on it, held until it is removed.
    _locks: Vec<Box<dyn kairos_wal::storage::LockGuard>>,
}

impl PreviousRun {
    /// Checks `dir`, refusing (with nothing removed) anything but nothing at all, an empty
    /// directory, or a Kairos data directory that a demo made ([`DEMO_MARKER`]) and no engine
    /// has open.
    fn check(dir: &Path) -> anyhow::Result<PreviousRun> {
        let absent = |dir: &Path| PreviousRun {
            dir: dir.to_path_buf(),
            present: false,
            cut_short: false,
            _locks: Vec::new(),
        };
        // Through a symbolic link: `--dir` may name a directory by a link to it (its contents
        // are what is removed; the link stays).
        let meta = match std::fs::metadata(dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(absent(dir)),
            Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", dir.display())),
        };
        if !meta.is_dir() {
            bail!("{} exists and is not a directory", dir.display());
        }
        if entries(dir)?.is_empty() {
            return Ok(absent(dir));
        }
        ensure!(
            looks_like_data_dir(dir)?,
            "refusing to remove {}: it holds files a Kairos data directory does not (only \
             {DEMO_MARKER}, LOCK, wal/, checkpoint/ and overflow/ with their own files), so it \
             may not be one; choose another --dir",
            dir.display()
        );
        ensure!(
            std::fs::symlink_metadata(dir.join(DEMO_MARKER)).is_ok_and(|m| m.is_file()),
            "refusing to remove {}: it is a Kairos data directory that `kairos demo` did not \
             make (it has no {DEMO_MARKER} file), perhaps an application's; choose another \
             --dir (or, if it is only a demo's from before demos marked theirs, remove it \
             yourself)",
            dir.display()
        );
        // Never delete a directory an engine holds open (here or in another
        // process): take its locks first, and keep them while removing.
        let locks = [dir.join("LOCK"), dir.join("wal").join("LOCK")]
            .iter()
            .filter(|lock| lock.is_file())
            .map(|lock| {
                FsStorage.lock(lock).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::WouldBlock {
                        anyhow::anyhow!(
                            "refusing to remove {}: it is open in another engine (lock held on {})",
                            dir.display(),
                            lock.display()
                        )
                    } else {
                        anyhow::Error::new(e).context(format!("cannot lock {}", lock.display()))
                    }
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // A finished demo wrote its log's last LSN into the marker: records logged since were
        // logged by something else (an application that adopted the directory). An open that
        // logs nothing (`kairos dead-letters list`, `checkpoint`) is not counted.
        let finished = finished_lsn(dir)?;
        if let Some(at_finish) = finished {
            let now = last_lsn(dir).with_context(|| {
                format!(
                    "refusing to remove {}: its log cannot be read to tell whether anything used \
                     it since the demo; remove it yourself if it is only a demo's",
                    dir.display()
                )
            })?;
            ensure!(
                now <= at_finish,
                "refusing to remove {}: its log has records up to LSN {now}, logged since the \
                 `kairos demo` that made it finished at LSN {at_finish}, so something else has \
                 used it; choose another --dir",
                dir.display()
            );
        }
        Ok(PreviousRun {
            dir: dir.to_path_buf(),
            present: true,
            cut_short: finished.is_none(),
            _locks: locks,
        })
    }

    /// Removes the directory's contents but its [`DEMO_MARKER`], which it first rewrites as
    /// a run's that has not finished (the caller's [`mark_as_demo`] then writes it again);
    /// returns whether there was anything to remove.
    ///
    /// So a kill (Ctrl-C) at any moment of the removal leaves a directory the next run
    /// removes: the marker is there, and says nothing about the log, which may be half gone.
    /// (Removing the marker along with the rest, in whatever order the directory lists its
    /// entries, could leave the engine's files without it — refused as perhaps an
    /// application's — or a finished run's marker beside a half-removed log, refused as a log
    /// that cannot be read.) The check before it ([`PreviousRun::check`], whose locks are
    /// held until this returns) has already found that nothing but the demo used it.
    fn remove(self) -> anyhow::Result<bool> {
        self.remove_with(&mut || Ok(()))
    }

    /// [`PreviousRun::remove`], calling `step` before each change to the directory; an
    /// error from it stops the removal there (tests: a kill at that point).
    fn remove_with(self, step: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<bool> {
        if !self.present {
            return Ok(false);
        }
        let dir = &self.dir;
        step()?;
        write_marker(dir, DEMO_MARKER_TEXT, step)?;
        // The directory's contents, not the directory: `--dir .` must not fail
        // halfway (a directory cannot remove itself as `.`), nor leave a caller
        // whose working directory it is in a deleted directory.
        for entry in
            std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
            if entry.file_name() == DEMO_MARKER {
                continue;
            }
            let path = entry.path();
            step()?;
            let removed = if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.with_context(|| format!("cannot remove {}", path.display()))?;
        }
        Ok(true)
    }
}

/// The start of the line of [`DEMO_MARKER`] where a finished demo records its log's last LSN.
const DEMO_MARKER_LSN: &str = "last LSN when the demo finished: ";

/// The LSN of the last record of the log in `dir/wal` (0 for none), read without changing
/// anything (as `kairos verify` reads it).
fn last_lsn(dir: &Path) -> anyhow::Result<u64> {
    let report = kairos_wal::scan(
        &FsStorage,
        &dir.join("wal"),
        kairos_wal::format::RECORD_BYTES_MAX_LIMIT,
        &mut |_| {},
    )?;
    Ok(report.last_lsn.0)
}

/// The last LSN a finished demo recorded in its marker; `None` for a run that did not finish
/// (cut short: nothing but a demo has used its directory since, as far as it knows).
fn finished_lsn(dir: &Path) -> anyhow::Result<Option<u64>> {
    let marker = dir.join(DEMO_MARKER);
    let text = std::fs::read_to_string(&marker)
        .with_context(|| format!("cannot read {}", marker.display()))?;
    let Some(line) = text.lines().find_map(|l| l.strip_prefix(DEMO_MARKER_LSN)) else {
        return Ok(None);
    };
    match line.trim().parse() {
        Ok(lsn) => Ok(Some(lsn)),
        Err(_) => bail!(
            "refusing to remove {}: its {DEMO_MARKER} file is not one `kairos demo` wrote \
             (line {line:?}); choose another --dir",
            dir.display()
        ),
    }
}

/// Rewrites [`DEMO_MARKER`] once the run is over (its engine shut down) with the log's last
/// LSN, so that the next run can tell whether anything logged records there since. Written
/// to a temporary file and renamed over the marker: a kill leaves the old or the new one.
fn mark_finished(dir: &Path) -> anyhow::Result<()> {
    let text = format!("{DEMO_MARKER_TEXT}{DEMO_MARKER_LSN}{}\n", last_lsn(dir)?);
    write_marker(dir, &text, &mut || Ok(()))
}

/// Replaces [`DEMO_MARKER`] in `dir` with `text`: written to [`DEMO_MARKER_TMP`] and renamed
/// over it, so a kill leaves the old or the new one. `step` is called before the rename
/// (see [`PreviousRun::remove_with`]).
fn write_marker(
    dir: &Path,
    text: &str,
    step: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let marker = dir.join(DEMO_MARKER);
    let tmp = dir.join(DEMO_MARKER_TMP);
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    step()?;
    std::fs::rename(&tmp, &marker)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), marker.display()))
}

/// Creates `dir` if needed and writes [`DEMO_MARKER`] in it, before the engine opens it: a
/// run cut short at any point leaves a directory the next run may remove.
fn mark_as_demo(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let marker = dir.join(DEMO_MARKER);
    std::fs::write(&marker, DEMO_MARKER_TEXT)
        .with_context(|| format!("cannot write {}", marker.display()))
}

/// Empty, or holding nothing but what a Kairos data directory holds — a
/// `LOCK` file ([`DEMO_MARKER`] too); `wal/` with the log's own files (segments, `META`, `LOCK`,
/// `CLOSED`, `SYNCED`, `TRIM`, and those names with `.tmp`); `checkpoint/`
/// and `overflow/` with theirs, each name parsed as the engine writes it —
/// and at least `wal/`, `LOCK` or the marker (a run stopped before its engine opened). One file of anyone else's (a `backup.seg`
/// included), and the directory is not removed.
fn looks_like_data_dir(dir: &Path) -> anyhow::Result<bool> {
    use kairos::{checkpoint, overflow};
    use kairos_wal::format as wal;
    let top = entries(dir)?;
    if top.is_empty() {
        return Ok(true);
    }
    let mut marked = false;
    for (name, is_dir) in &top {
        let path = dir.join(name);
        let ours = match (name.as_str(), is_dir) {
            (wal::LOCK_FILE_NAME | DEMO_MARKER | DEMO_MARKER_TMP, false) => {
                marked = true;
                true
            }
            ("wal", true) => {
                marked = true;
                only_files_named(&path, |n| {
                    let n = n.strip_suffix(wal::TMP_SUFFIX).unwrap_or(n);
                    [
                        wal::META_FILE_NAME,
                        wal::LOCK_FILE_NAME,
                        wal::CLOSED_FILE_NAME,
                        wal::SYNCED_FILE_NAME,
                        wal::TRIM_FILE_NAME,
                    ]
                    .contains(&n)
                        || wal::parse_segment_file_name(n).is_some()
                })?
            }
            (checkpoint::CHECKPOINT_DIR_NAME, true) => only_files_named(&path, |n| {
                checkpoint::parse_file_name(n).is_some()
                    || n.strip_suffix(checkpoint::TMP_SUFFIX)
                        .is_some_and(|n| n.ends_with(checkpoint::CHECKPOINT_SUFFIX))
            })?,
            // Overflow files are written as NAME.tmp too (checkpoint::TMP_SUFFIX).
            (overflow::OVERFLOW_DIR_NAME, true) => only_files_named(&path, |n| {
                overflow::parse_file_name(n.strip_suffix(checkpoint::TMP_SUFFIX).unwrap_or(n))
                    .is_some()
            })?,
            _ => false,
        };
        if !ours {
            return Ok(false);
        }
    }
    Ok(marked)
}

/// The names of `dir`'s entries, each with whether it is a directory (a
/// symbolic link is not).
fn entries(dir: &Path) -> anyhow::Result<Vec<(String, bool)>> {
    let list = || format!("cannot list {}", dir.display());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(list)? {
        let entry = entry.with_context(list)?;
        let is_dir = entry.file_type().with_context(list)?.is_dir();
        names.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
    }
    Ok(names)
}

/// Whether every entry of `dir` is a file (not a directory) whose name
/// `ours` accepts.
fn only_files_named(dir: &Path, ours: impl Fn(&str) -> bool) -> anyhow::Result<bool> {
    Ok(entries(dir)?
        .iter()
        .all(|(name, is_dir)| !is_dir && ours(name)))
}

/// Writes the receipts as CSV with a header line.
fn write_samples(
    path: &Path,
    file: std::fs::File,
    samples: &[consumers::Sample],
) -> anyhow::Result<()> {
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "due_ms,received_us,attempt,generation")?;
    for s in samples {
        writeln!(
            out,
            "{},{},{},{}",
            s.due_ms, s.received_us, s.attempt, s.generation
        )?;
    }
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Assembles the report and judges the invariants.
fn report(args: &DemoArgs, s: &Settings, f: &Findings) -> Report {
    let (t, e, r, o) = (&f.tally, &f.events, &f.restart, &f.overflow);
    let busy_s = f.schedule_busy.as_secs_f64();
    let mut report = Report {
        tasks: s.workload.tasks,
        time_scale: s.workload.time_scale,
        durability: format!("{:?}", args.durability.mode).to_lowercase(),
        interval_ms: (args.durability.mode == DurabilityMode::Interval)
            .then(|| args.durability.interval_ms()),
        dir: s.dir.display().to_string(),
        seed: s.workload.seed,
        segment_bytes: s.config.segment_bytes,
        producers: s.producers,
        batch: s.batch,
        consumers: s.consumers,
        ackers: s.ackers,
        lease_ms: args.lease_ms,
        max_attempts: s.config.retry.max_attempts,
        retry_ms: args.retry_ms,
        crash_holding: s.crash_holding,
        elapsed_ms: millis(f.elapsed),
        scheduled: t.scheduled,
        schedule_ms: millis(f.schedule_time),
        schedule_busy_ms: millis(f.schedule_busy),
        schedule_per_sec: if busy_s > 0.0 {
            (t.scheduled as f64 / busy_s).round()
        } else {
            0.0
        },
        rate: s.rate.map(f64::round),
        cancel_planned: e.cancel_planned,
        cancelled: t.cancelled,
        cancel_too_late: e.cancel_in_flight + e.cancel_not_found,
        cancel_in_flight: e.cancel_in_flight,
        cancel_not_found: e.cancel_not_found,
        delivered: t.delivered,
        acked: t.acked,
        dead_lettered: t.dead_lettered,
        dead_lettered_unplanned: t.dead_lettered_unplanned,
        dead_letters_kept: f.dead_letters_kept as u64,
        abandoned: t.abandoned,
        receipts: f.samples.len() as u64,
        redelivered: e.redelivered,
        redelivered_after_nack: e.redelivered_after_nack,
        redelivered_after_lease: e.redelivered_after_lease,
        redelivered_after_restart: e.redelivered_after_restart,
        nacked: e.nacked,
        retried: e.retried,
        nack_finished: e.nack_finished,
        lease_expired: t.lease_expired,
        crashed_holding: e.crashed_holding,
        ack_refused: e.refused_closed + e.refused_lease_expired + e.refused_stale,
        ack_refused_closed: e.refused_closed,
        ack_refused_lease_expired: e.refused_lease_expired,
        ack_refused_stale: e.refused_stale,
        lost: t.lost,
        duplicates: t.duplicates,
        attempt_gaps: e.attempt_gaps,
        cancelled_then_delivered: t.cancelled_then_delivered,
        early: e.early,
        unacked: t.unacked,
        payload_mismatches: e.payload_mismatches,
        foreign_keys: e.foreign_keys,
        lateness_ms: Lateness::measure(&f.samples, r.reopened_at_ms),
        restart_at_ms: millis(r.at),
        shutdown_ms: millis(r.shutdown),
        downtime_ms: millis(s.downtime),
        reopen_ms: millis(r.reopen),
        pending_at_shutdown: r.pending_at_shutdown as u64,
        abandoned_at_shutdown: t.abandoned_at_shutdown,
        recovered_pending: r.recovery.pending as u64,
        recovered_dead_lettered: r.recovery.dead_lettered as u64,
        recovered_overdue: r.recovery.overdue as u64,
        recovered_redelivered: r.recovery.redelivered as u64,
        recovered_records: r.recovery.wal.records,
        recovered_clean_shutdown: r.recovery.wal.clean_shutdown,
        recovered_torn_tail: r.recovery.wal.torn_tail.as_ref().map(|t| {
            format!(
                "{}@{} ({} bytes)",
                t.file.display(),
                t.offset,
                t.bytes_truncated
            )
        }),
        pending_at_end: f.pending_at_end as u64,
        horizon_ms: args.horizon.map(millis),
        payload_window_ms: s.config.payload_window.map(millis),
        checkpoint_every_ms: s.checkpoint_every.map(millis),
        checkpoints: o.checkpoints,
        payloads_moved: o.payloads_moved,
        payloads_on_disk_max: o.payloads_on_disk_max,
        overflow_promoted: o.promoted,
        engine_deliveries: f.engine_totals.deliveries,
        engine_acks: f.engine_totals.acks,
        engine_nacks: f.engine_totals.nacks,
        engine_retries: f.engine_totals.retries,
        engine_lease_expiries: f.engine_totals.lease_expiries,
        engine_dead_lettered: f.engine_totals.dead_lettered,
        timed_out: f.timed_out,
        max_p99_ms: args.max_p99_ms.unwrap_or(DEFAULT_MAX_P99_MS),
        p99_is_gate: args.max_p99_ms.is_some(),
        ok: false,
        violations: Vec::new(),
        warnings: Vec::new(),
    };
    report.judge();
    report
}

/// A duration in whole milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `dir` as a finished demo leaves it: the engine's files (a log with records after
    /// a checkpoint, an overflow file the checkpoint moved a payload to) and a marker with
    /// the log's last LSN.
    fn finished_demo(dir: &Path) -> anyhow::Result<()> {
        mark_as_demo(dir)?;
        let mut config = Config::default();
        config.payload_window = Some(Duration::from_secs(1));
        let engine = kairos::Engine::open(dir, config)?;
        engine.schedule_after(b"later", Duration::from_secs(3_600), b"payload")?;
        ensure!(engine.checkpoint()?.payloads_moved == 1, "no payload moved");
        engine.schedule_after(b"after", Duration::from_secs(3_600), b"")?;
        engine.shutdown()?;
        mark_finished(dir)
    }

    /// The sorted names at the top of `dir`.
    fn names(dir: &Path) -> anyhow::Result<Vec<String>> {
        let mut names: Vec<String> = entries(dir)?.into_iter().map(|(n, _)| n).collect();
        names.sort();
        Ok(names)
    }

    /// A kill (Ctrl-C) while the next run removes a finished demo's directory, before any of
    /// its 6 changes (marker written aside, renamed, 4 entries removed), leaves a directory
    /// the run after that checks and removes, down to the marker, as a run's that did not
    /// finish once the marker was rewritten. The marker used to be removed like any entry,
    /// in the order the directory lists them: a kill after it left the engine's files
    /// without it (refused: "`kairos demo` did not make"), and a kill after `wal/` left a
    /// finished run's marker beside no log (refused: "its log cannot be read").
    #[test]
    fn a_removal_cut_short_at_any_step_leaves_a_directory_the_next_run_removes(
    ) -> anyhow::Result<()> {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        for kill_at in 0..=6 {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            finished_demo(&dir)?;
            assert_eq!(
                names(&dir)?,
                ["DEMO", "LOCK", "checkpoint", "overflow", "wal"]
            );
            let previous = PreviousRun::check(&dir)?;
            assert!(previous.present && !previous.cut_short);
            let mut steps = 0;
            let removal = previous.remove_with(&mut || {
                if steps == kill_at {
                    bail!("killed");
                }
                steps += 1;
                Ok(())
            });
            match removal {
                Ok(removed) => {
                    assert!(removed);
                    assert_eq!(kill_at, 6, "the removal has 6 steps");
                    assert_eq!(names(&dir)?, ["DEMO"]);
                    continue;
                }
                Err(e) => assert_eq!(e.to_string(), "killed"),
            }
            // The next run, whose locks the killed one's no longer block.
            let next = PreviousRun::check(&dir)
                .with_context(|| format!("killed before step {kill_at}"))?;
            assert!(next.present);
            assert_eq!(next.cut_short, kill_at >= 2, "killed before step {kill_at}");
            assert!(next.remove()?);
            assert_eq!(names(&dir)?, ["DEMO"]);
            assert_eq!(
                std::fs::read_to_string(dir.join(DEMO_MARKER))?,
                DEMO_MARKER_TEXT
            );
        }
        Ok(())
    }
}
