//! `kairos checkpoint DIR`: takes a checkpoint of a data directory offline
//! and deletes the log segments it covers.
//!
//! It opens the engine on DIR as an application would (through
//! `dead_letters::open`, which refuses a directory that is open elsewhere or
//! has no log), calls `Engine::checkpoint` and shuts the engine down cleanly.

use super::dead_letters::{open, report_settled, Target};
use super::{plural, Verdict};
use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

/// Write a checkpoint of a data directory, offline, and delete the log
/// segments it covers.
#[derive(Debug, Args)]
#[command(long_about = "\
Write a checkpoint of a data directory, offline, and delete the log segments it covers.

A checkpoint holds every live task and dead letter as of the log's last record \
(DIR/checkpoint/{LSN}.ckpt, format in wal/FORMAT.md); the next open reads it and only the log \
after it, and the sealed log segments it covers are deleted (the newest segment, which the log \
still appends to, stays until the log rolls to a new one: a log smaller than a segment keeps \
every record, and the report says 0 log segments deleted). A running engine takes checkpoints by \
itself (Config::checkpoint_log_bytes, Config::checkpoint_interval); this command is for a \
directory no engine has open — it takes the directory's lock and refuses one that is open.

The engine is opened with deliveries paused: tasks already due are not handed out, and stay in \
the checkpoint as they are. Opening settles deliveries that were in flight when the engine last \
crashed, as every open does (see `kairos dead-letters --help`).

Exit status 0 on success; 1 if the directory cannot be opened or the checkpoint fails; 2 on bad \
usage.")]
pub struct CheckpointArgs {
    #[command(flatten)]
    target: Target,
}

/// What was done, as printed.
#[derive(Debug, Serialize)]
struct Outcome {
    dir: PathBuf,
    /// The checkpoint's LSN.
    lsn: u64,
    /// False if the newest checkpoint already covered the whole log.
    written: bool,
    tasks: u64,
    dead_letters: u64,
    bytes: u64,
    segments_removed: usize,
    /// Payloads moved out of memory (or out of compacted overflow files)
    /// into the checkpoint's overflow file.
    payloads_moved: u64,
    overflow_files_removed: usize,
    elapsed_ms: f64,
}

/// Runs `kairos checkpoint`.
pub fn run(args: &CheckpointArgs) -> anyhow::Result<Verdict> {
    let target = &args.target;
    target.check_usage("checkpoint")?;
    let engine = open(target)?;
    report_settled(&engine, target);
    let taken = engine
        .checkpoint()
        .with_context(|| format!("cannot checkpoint {}", target.dir.display()));
    let closed = engine
        .shutdown()
        .with_context(|| format!("cannot shut the engine on {} down", target.dir.display()));
    let report = taken?;
    closed?;
    let outcome = Outcome {
        dir: target.dir.clone(),
        lsn: report.lsn,
        written: report.written,
        tasks: report.tasks,
        dead_letters: report.dead_letters,
        bytes: report.bytes,
        segments_removed: report.segments_removed,
        payloads_moved: report.payloads_moved,
        overflow_files_removed: report.overflow_files_removed,
        elapsed_ms: report.elapsed.as_secs_f64() * 1e3,
    };
    if target.json {
        outln!("{}", serde_json::to_string_pretty(&outcome)?);
    } else if outcome.written {
        outln!(
            "checkpoint of {} at LSN {}: {}, {}, {} bytes, {} deleted, {} moved to an overflow file, {} deleted, {:.1} ms",
            outcome.dir.display(),
            outcome.lsn,
            plural(outcome.tasks as u64, "live task", "live tasks"),
            plural(outcome.dead_letters as u64, "dead letter", "dead letters"),
            outcome.bytes,
            plural(outcome.segments_removed as u64, "log segment", "log segments"),
            plural(outcome.payloads_moved as u64, "payload", "payloads"),
            plural(outcome.overflow_files_removed as u64, "overflow file", "overflow files"),
            outcome.elapsed_ms
        );
    } else {
        outln!(
            "{}: the checkpoint at LSN {} already covers the whole log; {} deleted",
            outcome.dir.display(),
            outcome.lsn,
            plural(
                outcome.segments_removed as u64,
                "log segment",
                "log segments"
            )
        );
    }
    Ok(Verdict::Pass)
}
