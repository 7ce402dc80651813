//! `kairos salvage DIR [--discard]`: finds the tasks whose overflow entries are damaged and,
//! asked to, discards them so that the directory opens.
//!
//! A checkpoint keeps the payloads of tasks not due soon, and far tasks whole (key, due time,
//! payload), in overflow files (`wal/FORMAT.md`, "Overflow files"). An entry there that a live
//! task needs and that no longer reads back (a flipped bit, a bad sector, a missing file) is
//! durable data lost: the engine is poisoned when it reaches it — at that task's delivery, or
//! at every open when the task is overdue — and stays so however often it is reopened. This
//! command reads the directory as `kairos verify` does (the newest checkpoint that reads, the
//! log after it with the engine's replay rules), then reads, one at a time as the engine
//! does, every entry a task or dead letter live at the end of the log needs in the overflow
//! files that do not read back whole. It lists each entry that is damaged: the task id, what
//! the entry holds for it, its key when known outside the entry (a far task's is only in the
//! entry), the file, the offset and the reason.
//!
//! With `--discard`, when something is listed (otherwise nothing is written, not a byte), it
//! takes the directory's lock (refusing one an engine has open), opens the log, reads the
//! directory again under the lock, and appends, in one frame under `Sync`, a CANCEL for each such task and a PURGE for
//! each such dead letter — records the engine itself writes, replayed by id without reading
//! the entry (`wal/FORMAT.md`, "Kairos record bodies") — then closes the log cleanly and reads
//! the directory again to check that nothing a live task needs is damaged any more. The
//! damaged entries are then dead: the engine's promotion of far tasks reads past them, `kairos
//! verify` reports them as a warning, and they go with their file once a checkpoint no longer
//! names it. This is an operator's explicit choice, as SQLite's `.recover` or RocksDB's WAL
//! recovery modes are: those tasks' keys and payloads are lost; every other task is kept.
//!
//! An overflow file that is missing, or whose header does not read, loses every entry in it:
//! every task that needs one is listed (once none does, the engine's open counts such a file
//! empty, and the next checkpoint deletes it).
//!
//! What it cannot mend (it says so and writes nothing): damage in the log or in the checkpoint
//! (`kairos verify` names it), and the damaged entry of a far task that a record after the
//! checkpoint names (delivered, rescheduled, nacked: the replay reads the task's key from it).

use super::verify::{
    dirs, missing_checkpoint, needed_entries, start_from_checkpoint, DamagedEntry, EntryUse,
    Failure, FarReader,
};
use super::{ckpt as checkpoint, far, plural, record, Record, Replay, Verdict};
use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use kairos_wal::{FsStorage, Storage, Wal, WalError, WalOptions};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// List the tasks whose overflow entries are damaged; with --discard, cancel them so the
/// directory opens.
#[derive(Debug, Args)]
#[command(long_about = "\
List the tasks whose overflow entries are damaged; with --discard, cancel them so that the \
directory opens and every other task is kept.

A checkpoint keeps the payloads of tasks not due soon, and far tasks whole (key, due time, \
payload), in overflow files (DIR/overflow). An entry there that a live task needs and that no \
longer reads back — a flipped bit, a bad sector, a missing file — is durable data lost: the \
engine is poisoned when it reaches it (at that task's delivery, or at every open when the task \
is overdue). This command reads DIR as `kairos verify` does, then reads every entry a live task \
or dead letter needs in the overflow files that do not read back whole, one at a time as the \
engine does, and lists each damaged one: the task id, what the entry holds for it (a far task's \
whole entry, a task's payload, a dead letter's payload), its key when known outside the entry, \
the file, the offset and the reason. Nothing is written.

With --discard, when something is listed (otherwise not a byte is written), it takes DIR's \
lock (a directory an engine has open is refused: stop it first), reads DIR again, appends to \
the log one CANCEL record for each such task and one PURGE record for each such dead \
letter, in one frame, synced — the records a cancel and a purge write — and closes the log \
cleanly; then it reads DIR again to check that nothing a live task needs is damaged. Those \
tasks' keys and payloads are lost; every other task is kept, and the engine opens. The damaged \
entries are dead from then on: the engine reads past them, `kairos verify` reports them as a \
warning, and they go with their file once a checkpoint no longer names it.

An overflow file that is missing, or whose header does not read, loses every entry in it: every \
task that needs one is listed.

A far task whose key a record after the checkpoint needed from its damaged entry (it was \
delivered, rescheduled or nacked since) is listed if it is still live, or a dead letter, at the \
end of the log — its key is lost with the entry — and cancelled (purged) by --discard like the \
others; if a later record finished it (acked, cancelled, purged), nothing needs the entry.

It cannot mend, and writes nothing for, damage in the log or the checkpoint (`kairos verify` \
names it).

With --json, one object: dir, checkpoint (the file read, or null), damaged (each: task_id; \
used_as, one of far_task, payload, dead_letter; key, or null when only the entry holds it; file; \
offset, the entry's; reason), warnings (damage no live task needs, as text), discarded, \
tasks_cancelled, dead_letters_purged, lsns ([first, last] of the records appended, or null).

Exit status 0 when no entry a live task needs is damaged, or --discard discarded every one; 1 \
when damaged entries are listed and not discarded, or the directory cannot be salvaged or read; \
2 on bad usage.")]
pub struct SalvageArgs {
    /// Data directory.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Cancel the tasks (and purge the dead letters) whose entries are damaged, logged like a
    /// cancel (a purge); without it nothing is written.
    #[arg(long)]
    discard: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// What salvage found, and did.
#[derive(Debug, Default, Serialize)]
struct Report {
    /// The data directory.
    dir: PathBuf,
    /// The checkpoint read (none: no overflow file is in use).
    checkpoint: Option<PathBuf>,
    /// Entries a live task or dead letter needs that do not read back.
    damaged: Vec<Damaged>,
    /// Damage no live task needs (as `kairos verify` reports it).
    warnings: Vec<String>,
    /// Whether the damaged tasks were discarded (`--discard`).
    discarded: bool,
    /// Tasks cancelled.
    tasks_cancelled: usize,
    /// Dead letters purged.
    dead_letters_purged: usize,
    /// LSN of the first and the last record appended.
    lsns: Option<(u64, u64)>,
}

/// One damaged entry, as printed.
#[derive(Debug, Serialize)]
struct Damaged {
    task_id: u64,
    used_as: EntryUse,
    /// The key (UTF-8, lossily), when known outside the entry.
    key: Option<String>,
    file: PathBuf,
    offset: u64,
    reason: String,
}

impl From<DamagedEntry> for Damaged {
    fn from(d: DamagedEntry) -> Damaged {
        Damaged {
            task_id: d.task_id,
            used_as: d.used_as,
            key: d.key.map(|k| String::from_utf8_lossy(&k).into_owned()),
            file: d.file,
            offset: d.offset,
            reason: d.reason,
        }
    }
}

/// What a reading of the directory found.
#[derive(Debug, Default)]
struct Finding {
    checkpoint: Option<PathBuf>,
    damaged: Vec<DamagedEntry>,
    warnings: Vec<Failure>,
}

/// Runs `kairos salvage`.
pub fn run(args: &SalvageArgs) -> anyhow::Result<Verdict> {
    let (data_dir, log_dir) = dirs(&args.dir, "salvage")?;
    if data_dir == log_dir {
        bail!(
            "{} is not a Kairos data directory (it has no wal/): salvage works on a data \
             directory, whose checkpoint and overflow files it reads",
            args.dir.display()
        );
    }
    let storage: Arc<dyn Storage> = Arc::new(FsStorage);
    // Read first without writing anything: a directory salvage cannot mend, or with nothing
    // to discard, is left exactly as it is (not even a torn tail truncated).
    let mut finding = find(storage.as_ref(), &data_dir, &log_dir)?;
    let mut report = Report::default();
    let mut left = None;
    let verdict = if !args.discard || finding.damaged.is_empty() {
        if finding.damaged.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    } else {
        // Locked, then read again, so that no engine changes the directory between the
        // reading and the records appended (what is discarded is this reading's).
        let (wal, lock) = open_log(&storage, &data_dir, &log_dir)?;
        let again = find(storage.as_ref(), &data_dir, &log_dir);
        let outcome = again.and_then(|again| {
            finding = again;
            discard(&wal, &finding.damaged, &mut report)
        });
        let closed = wal.close();
        drop(lock);
        outcome?;
        closed.context("cannot close the log after appending")?;
        report.discarded = !finding.damaged.is_empty();
        // Read again: what a live task needs must all read back now.
        left = find(storage.as_ref(), &data_dir, &log_dir)?
            .damaged
            .into_iter()
            .next();
        if left.is_some() {
            Verdict::Fail
        } else {
            Verdict::Pass
        }
    };
    report.dir = data_dir.clone();
    report.checkpoint = finding.checkpoint.clone();
    report.warnings = finding.warnings.iter().map(|w| w.message.clone()).collect();
    report.damaged = finding.damaged.into_iter().map(Damaged::from).collect();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print(&report);
    }
    if let Some(left) = left {
        // Not expected: the records appended finish every task listed. Said after the report,
        // which names what was discarded.
        errln!(
            "kairos salvage: after discarding, task {} still needs the damaged entry at byte \
             offset {} of {}",
            left.task_id,
            left.offset,
            left.file.display()
        );
    }
    Ok(verdict)
}

/// Takes the data directory's lock (as the engine's open does) and opens its log under `Sync`.
fn open_log(
    storage: &Arc<dyn Storage>,
    data_dir: &Path,
    log_dir: &Path,
) -> anyhow::Result<(Wal, Box<dyn kairos_wal::storage::LockGuard>)> {
    let lock_path = data_dir.join("LOCK");
    let lock = storage.lock(&lock_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            anyhow!(
                "{} is open in an engine (lock held on {}): stop it first; salvage works offline",
                data_dir.display(),
                lock_path.display()
            )
        } else {
            anyhow!("cannot lock {}: {e}", lock_path.display())
        }
    })?;
    let options = WalOptions {
        durability: kairos_wal::Durability::Sync,
        ..WalOptions::default()
    };
    let (wal, _) =
        Wal::open(Arc::clone(storage), log_dir, options, &mut |_| Ok(())).map_err(|e| match e {
            WalError::Locked { .. } => anyhow!(
                "{} is open in an engine (its log's lock is held): stop it first; salvage works \
                 offline",
                data_dir.display()
            ),
            other => anyhow::Error::new(other).context(format!(
                "cannot open the log {} (kairos verify names its damage; salvage mends \
                 overflow entries only)",
                log_dir.display()
            )),
        })?;
    Ok((wal, lock))
}

/// Appends a CANCEL for each damaged task and a PURGE for each damaged dead letter, in one
/// frame, and waits until it is durable.
fn discard(wal: &Wal, damaged: &[DamagedEntry], report: &mut Report) -> anyhow::Result<()> {
    if damaged.is_empty() {
        return Ok(());
    }
    // Bodies per `wal/FORMAT.md`: CANCEL and PURGE are the task id, u64 little-endian.
    let bodies: Vec<(u8, [u8; 8])> = damaged
        .iter()
        .map(|d| {
            let kind = match d.used_as {
                EntryUse::DeadLetter => record::RECORD_PURGE,
                EntryUse::FarTask | EntryUse::Payload => record::RECORD_CANCEL,
            };
            (kind, d.task_id.to_le_bytes())
        })
        .collect();
    let records: Vec<kairos_wal::Record<'_>> = bodies
        .iter()
        .map(|(kind, body)| kairos_wal::Record {
            record_type: *kind,
            body,
        })
        .collect();
    let ticket = wal.append(&records).context("cannot append to the log")?;
    let (first, last) = (ticket.first_lsn().0, ticket.last_lsn().0);
    ticket
        .wait()
        .context("cannot make the appended records durable")?;
    report.lsns = Some((first, last));
    report.dead_letters_purged = damaged
        .iter()
        .filter(|d| d.used_as == EntryUse::DeadLetter)
        .count();
    report.tasks_cancelled = damaged.len() - report.dead_letters_purged;
    Ok(())
}

/// Reads the directory as the engine's open would and returns the overflow entries that tasks
/// and dead letters live at the end of the log need and that do not read back.
fn find(storage: &dyn Storage, data_dir: &Path, log_dir: &Path) -> anyhow::Result<Finding> {
    let checkpoint_dir = data_dir.join(checkpoint::CHECKPOINT_DIR_NAME);
    let cannot = |f: Failure| {
        anyhow!(
            "{} (salvage mends damaged overflow entries only; `kairos verify` names this \
             damage)",
            f.message
        )
    };
    let Some(mut start) =
        start_from_checkpoint(storage, &checkpoint_dir, log_dir).map_err(cannot)?
    else {
        // No checkpoint: every payload is in the log, no overflow file is in use — but the
        // log is still read and replayed as the open would, so that salvage does not call a
        // directory whose log is damaged sound (it cannot mend it: it says so).
        let mut replay = Replay::default();
        let (scan, _) = replay_log(
            storage,
            log_dir,
            0,
            &mut replay,
            &FarReader::new(storage, None),
        )?;
        if scan.segments.is_empty() && !Failure::log_creation_cut_short(log_dir) {
            return Err(cannot(Failure::no_log(log_dir)));
        }
        let first = scan
            .segments
            .first()
            .map(|s| (s.file.as_path(), s.first_lsn.0));
        if let Some(failure) = missing_checkpoint(first, false) {
            return Err(cannot(failure));
        }
        return Ok(Finding::default());
    };
    let mut finding = Finding {
        checkpoint: Some(start.summary.file.clone()),
        ..Finding::default()
    };
    if let Some(newer) = start.newer_damage.take() {
        finding.warnings.push(newer);
    }
    // The log after the checkpoint, replayed by the engine's rules.
    let far_reader = FarReader::new(storage, Some(&start));
    let mut replay = std::mem::take(&mut start.replay);
    let (scan, after) = replay_log(
        storage,
        log_dir,
        start.summary.lsn,
        &mut replay,
        &far_reader,
    )?;
    start.check_log(scan.last_lsn.0, after).map_err(cannot)?;
    if start.damaged_overflow.is_empty() {
        return Ok(finding);
    }
    let files: Vec<u32> = start.damaged_overflow.iter().map(|d| d.file).collect();
    let needed = needed_entries(&replay, &files);
    let hasher = far::KeyHasher::new(&start.store_id);
    for d in &start.damaged_overflow {
        let lost = d
            .needed_damage(storage, &needed, &hasher)
            .map_err(|f| anyhow!("cannot read {}: {}", d.path.display(), f.message))?;
        if lost.is_empty() {
            finding.warnings.push(d.unneeded_warning());
        }
        finding.damaged.extend(lost);
    }
    finding.damaged.sort_by_key(|d| (d.file.clone(), d.offset));
    Ok(finding)
}

/// Reads the log in `log_dir` and replays on `replay`, by the engine's rules, the records above
/// `covered` (the checkpoint's LSN; 0 without one); returns the scan's report and the number of
/// records replayed. A log that does not read, or a record that does not replay, is an error
/// naming it: salvage cannot mend either.
fn replay_log(
    storage: &dyn Storage,
    log_dir: &Path,
    covered: u64,
    replay: &mut Replay,
    far_reader: &FarReader<'_>,
) -> anyhow::Result<(kairos_wal::ScanReport, u64)> {
    let mut after = 0u64;
    let mut blocked: Option<String> = None;
    let scan = kairos_wal::scan_located(
        storage,
        log_dir,
        kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        &mut |view, at| {
            if view.lsn.0 <= covered || blocked.is_some() {
                return;
            }
            after += 1;
            let applied = Record::decode(view.record_type, view.body)
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    replay
                        .apply_with(&r, &mut |t| far_reader.read(t))
                        .map_err(|e| e.to_string())
                });
            if let Err(reason) = applied {
                blocked = Some(format!(
                    "the record at LSN {} ({}, byte offset {}) does not replay: {reason}",
                    view.lsn.0,
                    at.file.display(),
                    at.offset
                ));
            }
        },
    )
    .map_err(|e| {
        anyhow!(
            "the log does not read: {e} (salvage mends damaged overflow entries only; `kairos \
             verify` names this damage)"
        )
    })?;
    if let Some(reason) = blocked {
        bail!(
            "{reason}; salvage mends damaged overflow entries only, not a log that breaks the \
             replay rules (`kairos verify` names it)"
        );
    }
    Ok((scan, after))
}

/// Prints the report as text.
fn print(r: &Report) {
    outln!("data directory  {}", r.dir.display());
    match &r.checkpoint {
        Some(c) => outln!("checkpoint      {}", c.display()),
        None => outln!("checkpoint      none (no overflow file is in use)"),
    }
    for w in &r.warnings {
        outln!("WARNING: {w}");
    }
    if r.damaged.is_empty() {
        outln!("damaged         none: every overflow entry a live task or dead letter needs reads back");
        return;
    }
    outln!(
        "damaged         {} that live tasks or dead letters need:",
        plural(r.damaged.len() as u64, "overflow entry", "overflow entries")
    );
    let mut far_keys_unknown = false;
    for d in &r.damaged {
        let noun = match d.used_as {
            EntryUse::FarTask => "far task",
            EntryUse::Payload => "task (payload)",
            EntryUse::DeadLetter => "dead letter (payload)",
        };
        let key = d.key.as_deref().map_or_else(
            || {
                far_keys_unknown = true;
                "key only in the entry".to_string()
            },
            |k| format!("key {k:?}"),
        );
        // The reason names the file (and the entry's offset, where the damage is in it).
        outln!("  {noun} {}, {key}: {}", d.task_id, d.reason);
    }
    if far_keys_unknown {
        outln!(
            "                a far task's key is only in its entry; its SCHEDULE record (with \
             the key) may still be in the log: `kairos dump {}` prints every record the log \
             holds (task=ID)",
            r.dir.display()
        );
    }
    if r.discarded {
        let (first, last) = r.lsns.unwrap_or_default();
        outln!(
            "discarded       {}, {} (LSN {first}..{last}): the directory opens; their keys and \
             payloads are lost",
            plural(
                r.tasks_cancelled as u64,
                "task cancelled",
                "tasks cancelled"
            ),
            plural(
                r.dead_letters_purged as u64,
                "dead letter purged",
                "dead letters purged"
            ),
        );
    } else {
        outln!(
            "nothing written: `kairos salvage {} --discard` cancels these tasks (and purges these \
             dead letters), losing their keys and payloads, so that the engine opens and \
             delivers every other task",
            r.dir.display()
        );
    }
}
