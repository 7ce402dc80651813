//! `kairos dead-letters list|requeue|purge DIR`: the dead letters of a data
//! directory, managed offline.
//!
//! Each command opens the engine on DIR with deliveries paused (taking the
//! directory's lock, so it refuses a directory an engine has open), does its
//! work through the engine's own API — `Engine::dead_letters`,
//! `Engine::requeue_dead_letter`, `Engine::purge_dead_letter` — and shuts the
//! engine down cleanly.

use super::{describe, DurabilityArgs, Verdict};
use anyhow::{anyhow, bail, Context as _};
use clap::{Args, Subcommand};
use kairos::config::{KEY_BYTES_MAX_LIMIT, PAYLOAD_BYTES_MAX_LIMIT, PENDING_TASKS_LIMIT};
use kairos::{
    CancelError, Config, DeadLetter, Due, Engine, OpenError, RetryPolicy, ScheduleError, TaskId,
};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// List, requeue or purge the dead letters of a data directory, offline.
#[derive(Debug, Args)]
#[command(long_about = "\
List, requeue or purge the dead letters of a data directory, offline.

A dead letter is a task that used up its delivery attempts (RetryPolicy::max_attempts): it is \
kept, with the error of its last attempt, until it is requeued or purged.

Each command opens the engine on DIR as an application would (recovering the log), with \
deliveries paused (Config::deliveries_paused: no task is handed out, so tasks already due stay \
as they are), does its work and shuts the engine down cleanly. It takes the directory's lock: a \
directory that an engine has open — a running service — is refused; stop it first. Opening \
settles deliveries that were in flight when the engine last crashed, as every open does: they \
are retried, or dead-lettered if they had used --max-attempts attempts — the only task records \
`list` can write (it says so on stderr). To look without any write, use `kairos inspect DIR` \
(counts) or `kairos dump DIR` (every record, DEAD ones included).

Exit status 0 on success; 1 if an id given is not a dead letter, a requeue or purge fails \
(each failure is reported), or the directory cannot be opened; 2 on bad usage.")]
pub struct DeadLettersArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Print every dead letter: task id, attempts, when it died and the due
    /// time of its last attempt (UTC), payload size, key and last error.
    List(ListArgs),
    /// Put dead letters back as new tasks (new id, same key and payload,
    /// a fresh attempt count) and print their new ids.
    Requeue(RequeueArgs),
    /// Delete dead letters for good.
    Purge(PurgeArgs),
}

/// What every action opens (also `kairos checkpoint`).
#[derive(Debug, Args)]
pub(super) struct Target {
    /// Data directory (the one holding `wal/` and `LOCK`).
    #[arg(value_name = "DIR")]
    pub(super) dir: PathBuf,
    #[command(flatten)]
    durability: DurabilityArgs,
    /// The application's `RetryPolicy::max_attempts`. Only used to settle
    /// deliveries that were in flight at a crash, as the application's own
    /// open would.
    #[arg(long, value_name = "N", default_value_t = RetryPolicy::default().max_attempts,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Debug, Args)]
struct ListArgs {
    #[command(flatten)]
    target: Target,
}

/// Which dead letters: `--id` (repeatable) or `--all`, exactly one of them.
#[derive(Debug, Args)]
#[group(id = "which", required = true, multiple = false)]
struct Selection {
    /// A dead letter's task id (repeat for several).
    #[arg(long = "id", value_name = "ID")]
    ids: Vec<u64>,
    /// Every dead letter.
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
struct RequeueArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    which: Selection,
    /// Due this long from now: `0` (now), or whole numbers with units, e.g.
    /// `250ms`, `30s`, `5m`, `2h`, `1d`, `1h30m`.
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = super::parse_duration,
          allow_hyphen_values = true)]
    delay: Duration,
}

#[derive(Debug, Args)]
struct PurgeArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    which: Selection,
}

/// One dead letter, as printed.
#[derive(Debug, Serialize)]
struct Letter {
    task_id: u64,
    /// The key, lossily as UTF-8.
    key: String,
    attempts: u32,
    /// When it was dead-lettered, UTC ms.
    dead_ms: u64,
    /// The same, RFC 3339 UTC (`null` past the year 9999).
    dead_at: Option<String>,
    /// Due time of its last attempt, UTC ms.
    due_ms: u64,
    /// The same, RFC 3339 UTC (`null` past the year 9999).
    due_at: Option<String>,
    payload_bytes: usize,
    /// The error of its last attempt.
    error: String,
}

impl From<&DeadLetter> for Letter {
    fn from(d: &DeadLetter) -> Letter {
        Letter {
            task_id: d.task_id.0,
            key: String::from_utf8_lossy(&d.key).into_owned(),
            attempts: d.attempts,
            dead_ms: d.dead_ms,
            dead_at: describe::rfc3339(d.dead_ms),
            due_ms: d.due_ms,
            due_at: describe::rfc3339(d.due_ms),
            payload_bytes: d.payload.len(),
            error: d.error.clone(),
        }
    }
}

/// `list --json`.
#[derive(Debug, Serialize)]
struct Listing {
    dir: PathBuf,
    dead_letters: Vec<Letter>,
}

/// A dead letter put back as a new task.
#[derive(Debug, Serialize)]
struct Requeued {
    task_id: u64,
    new_task_id: u64,
    key: String,
}

/// A dead letter an action failed on, and why.
#[derive(Debug, Serialize)]
struct Failed {
    task_id: u64,
    error: String,
}

/// `requeue --json` and `purge --json`.
#[derive(Debug, Default, Serialize)]
struct Changes {
    dir: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    requeued: Option<Vec<Requeued>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    purged: Option<Vec<u64>>,
    failed: Vec<Failed>,
}

/// Runs the action and prints its outcome.
pub fn run(args: &DeadLettersArgs) -> anyhow::Result<Verdict> {
    let (target, subcommand) = match &args.action {
        Action::List(a) => (&a.target, "dead-letters list"),
        Action::Requeue(a) => (&a.target, "dead-letters requeue"),
        Action::Purge(a) => (&a.target, "dead-letters purge"),
    };
    target.check_usage(subcommand)?;
    let engine = open(target)?;
    report_settled(&engine, target);
    let outcome = match &args.action {
        Action::List(_) => list(&engine, target),
        Action::Requeue(a) => requeue(&engine, a),
        Action::Purge(a) => purge(&engine, a),
    };
    let closed = engine
        .shutdown()
        .with_context(|| format!("cannot shut the engine on {} down", target.dir.display()));
    let verdict = outcome?;
    closed?;
    Ok(verdict)
}

impl Target {
    /// A usage error (for `subcommand`) if the flags do not go together
    /// (`--interval-ms` without `--durability interval`).
    pub(super) fn check_usage(&self, subcommand: &str) -> anyhow::Result<()> {
        self.durability.check(subcommand)
    }
}

/// Opens the engine on the target directory. A directory without a log
/// (no `wal/`, or no `wal/META` in it) is refused rather than created.
pub(super) fn open(target: &Target) -> anyhow::Result<Engine> {
    let dir = &target.dir;
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    if !dir.join("wal").is_dir() {
        bail!(
            "{} is not a Kairos data directory: it has no wal/ log directory",
            dir.display()
        );
    }
    // An empty wal/ would be made a new log, and the command would answer
    // for a store that never existed.
    let meta = dir.join("wal").join(kairos_wal::format::META_FILE_NAME);
    if std::fs::symlink_metadata(&meta).is_err() {
        bail!(
            "{} is not a Kairos data directory: its wal/ holds no log ({} is missing)",
            dir.display(),
            meta.display()
        );
    }
    let engine = Engine::open(dir, config(target)).map_err(|e| match e {
        OpenError::Locked { .. } => anyhow!(
            "cannot open {}: it is open in another engine (lock held on {}); stop that process \
             first: this command works offline",
            dir.display(),
            dir.join("LOCK").display()
        ),
        other => anyhow::Error::new(other).context(format!("cannot open {}", dir.display())),
    })?;
    if let Some(skipped) = &engine.recovery().skipped_checkpoint {
        errln!(
            "kairos: WARNING: the newest checkpoint was passed over for an older one: {skipped}"
        );
    }
    Ok(engine)
}

/// The default configuration with the chosen durability and attempts, and
/// the size limits at their maxima: a dead letter the application accepted
/// under its own limits can always be requeued.
fn config(target: &Target) -> Config {
    let mut config = Config::default();
    config.durability = target.durability.durability();
    config.retry.max_attempts = target.max_attempts;
    config.key_bytes_max = KEY_BYTES_MAX_LIMIT;
    config.payload_bytes_max = PAYLOAD_BYTES_MAX_LIMIT;
    config.pending_tasks_max = PENDING_TASKS_LIMIT;
    // Nobody receives here: hand nothing out (nothing logged as delivered,
    // nothing taken back at shutdown).
    config.deliveries_paused = true;
    config
}

/// Says on stderr what the open did to deliveries in flight at a crash.
pub(super) fn report_settled(engine: &Engine, target: &Target) {
    let r = engine.recovery();
    if r.redelivered > 0 || r.dead_lettered > 0 {
        errln!(
            "kairos: the engine had crashed with deliveries in flight: {} will be \
             redelivered, {} were dead-lettered (--max-attempts {})",
            r.redelivered,
            r.dead_lettered,
            target.max_attempts
        );
    }
}

fn list(engine: &Engine, target: &Target) -> anyhow::Result<Verdict> {
    let letters: Vec<Letter> = engine.dead_letters().iter().map(Letter::from).collect();
    if target.json {
        let listing = Listing {
            dir: target.dir.clone(),
            dead_letters: letters,
        };
        outln!("{}", serde_json::to_string_pretty(&listing)?);
    } else {
        print_table(&target.dir, &letters);
    }
    Ok(Verdict::Pass)
}

/// The dead letters as an aligned table; key and error quoted and escaped
/// so that each letter stays on one line.
fn print_table(dir: &Path, letters: &[Letter]) {
    match letters.len() {
        0 => {
            outln!("no dead letters in {}", dir.display());
            return;
        }
        1 => outln!("1 dead letter in {}", dir.display()),
        n => outln!("{n} dead letters in {}", dir.display()),
    }
    let rows: Vec<[String; 7]> = letters
        .iter()
        .map(|l| {
            [
                l.task_id.to_string(),
                l.attempts.to_string(),
                rfc3339_or_ms(l.dead_ms),
                rfc3339_or_ms(l.due_ms),
                l.payload_bytes.to_string(),
                format!("{:?}", l.key),
                format!("{:?}", l.error),
            ]
        })
        .collect();
    let header = [
        "TASK_ID",
        "ATTEMPTS",
        "DEAD_AT (UTC)",
        "DUE_AT (UTC)",
        "PAYLOAD_BYTES",
        "KEY",
        "ERROR",
    ];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 7]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        outln!("{out}");
    };
    line(header);
    for row in &rows {
        line(row.each_ref().map(String::as_str));
    }
}

fn requeue(engine: &Engine, args: &RequeueArgs) -> anyhow::Result<Verdict> {
    let letters = engine.dead_letters();
    let ids = selected(&letters, &args.which);
    let keys: HashMap<u64, String> = letters
        .iter()
        .map(|d| (d.task_id.0, String::from_utf8_lossy(&d.key).into_owned()))
        .collect();
    let mut changes = Changes {
        dir: args.target.dir.clone(),
        ..Changes::default()
    };
    let mut done = Vec::new();
    for id in ids {
        match engine.requeue_dead_letter(TaskId(id), Due::After(args.delay)) {
            Ok(new) => done.push(Requeued {
                task_id: id,
                new_task_id: new.0,
                key: keys.get(&id).cloned().unwrap_or_default(),
            }),
            Err(e @ (ScheduleError::Closed | ScheduleError::Poisoned { .. })) => {
                return Err(anyhow::Error::new(e).context(format!("cannot requeue {id}")))
            }
            Err(e) => changes.failed.push(Failed {
                task_id: id,
                error: e.to_string(),
            }),
        }
    }
    if !args.target.json {
        for r in &done {
            outln!(
                "requeued dead letter {} (key {:?}) as task {}",
                r.task_id,
                r.key,
                r.new_task_id
            );
        }
    }
    let requeued = done.len();
    changes.requeued = Some(done);
    finish(&args.target, &args.which, &changes, requeued, "requeued")
}

fn purge(engine: &Engine, args: &PurgeArgs) -> anyhow::Result<Verdict> {
    let ids = selected(&engine.dead_letters(), &args.which);
    let mut changes = Changes {
        dir: args.target.dir.clone(),
        ..Changes::default()
    };
    let mut done = Vec::new();
    for id in ids {
        match engine.purge_dead_letter(TaskId(id)) {
            Ok(true) => done.push(id),
            Ok(false) => changes.failed.push(Failed {
                task_id: id,
                error: format!("no dead letter with task id {id}"),
            }),
            Err(e @ (CancelError::Closed | CancelError::Poisoned { .. })) => {
                return Err(anyhow::Error::new(e).context(format!("cannot purge {id}")))
            }
            Err(e) => changes.failed.push(Failed {
                task_id: id,
                error: e.to_string(),
            }),
        }
    }
    if !args.target.json {
        for id in &done {
            outln!("purged dead letter {id}");
        }
    }
    let purged = done.len();
    changes.purged = Some(done);
    finish(&args.target, &args.which, &changes, purged, "purged")
}

/// Prints the failures (and the JSON object if asked) and decides the
/// exit status: any failure fails the command.
fn finish(
    target: &Target,
    which: &Selection,
    changes: &Changes,
    done: usize,
    verb: &str,
) -> anyhow::Result<Verdict> {
    if target.json {
        outln!("{}", serde_json::to_string_pretty(changes)?);
    }
    for f in &changes.failed {
        errln!(
            "kairos dead-letters: dead letter {}: {}",
            f.task_id,
            f.error
        );
    }
    if !target.json {
        let asked = done + changes.failed.len();
        if asked == 0 && which.all {
            outln!("no dead letters in {}", target.dir.display());
        } else {
            outln!("{verb} {done} of {asked} dead letters");
        }
    }
    Ok(if changes.failed.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail
    })
}

/// The ids to act on, each once, in the order given (`--all`: every one
/// of `letters`, oldest first).
fn selected(letters: &[DeadLetter], which: &Selection) -> Vec<u64> {
    if which.all {
        return letters.iter().map(|d| d.task_id.0).collect();
    }
    let mut seen = HashSet::new();
    which
        .ids
        .iter()
        .copied()
        .filter(|id| seen.insert(*id))
        .collect()
}

/// `ms` as RFC 3339 UTC with milliseconds ([`describe::rfc3339`], as `dump`
/// and `inspect` write times); past the year 9999, which RFC 3339 cannot
/// write, the raw integer in the table and `null` in JSON.
fn rfc3339_or_ms(ms: u64) -> String {
    describe::rfc3339(ms).unwrap_or_else(|| format!("{ms} ms"))
}
