//! `kairos inspect DIR`: a summary of a data directory — its checkpoint, its
//! log segments, how the last run ended, the pending tasks by state and where
//! their payloads are, its overflow files (entries, live entries, due range),
//! the bytes each part of the directory uses, and how much of each segment is
//! still needed.
//!
//! Read-only and safe on an untrusted directory: the newest checkpoint that
//! reads back is chosen as the engine's open chooses it (`verify`'s
//! `start_from_checkpoint`; `kairos::checkpoint::read` bounds every length),
//! the log is read through `kairos_wal::scan_located` (lengths checked before
//! anything is allocated, no memory maps), and the records above the
//! checkpoint's LSN are decoded with `Record::decode` and replayed on its state
//! with the engine's own rules (`kairos::replay::Replay`, as `kairos verify`
//! does; a far task's key and due time are read from its overflow entry when a
//! record names it). Memory: the checkpoint's keys (twice for the tasks whose
//! payload it places in an overflow file), 32 bytes per far task (twice: the
//! replay's, and the entries to check), and one small entry per task live at
//! the point read (the replay's, and the latest schedule's segment and size),
//! not per record. Overflow files are read one at a time, each file's entries
//! into memory (`kairos::overflow::read_file`, which checks every entry,
//! reading through a window of about 1 MiB, so a length field or a sparse
//! file allocates nothing beyond the entries that check): bounded by the
//! entries of the largest file, not by the number of tasks.

use super::describe::{file_name, rfc3339, type_name};
use super::verify::{
    check_overflow_entries, dirs, missing_checkpoint, not_regular_files, orphan_damage,
    start_from_checkpoint_deferring_overflow, Cause, CheckpointStart, DamagedOverflowFile,
    EntryKey, EntryUse, Failure, FarReader, NeededEntries, OverflowRef, Tally, Torn,
};
use super::{plural, Verdict};
use clap::Args;
use kairos::checkpoint as ckpt;
use kairos::far::KeyHasher;
use kairos::overflow as ovf;
use kairos::record::Record;
use kairos::replay::{Replay, StillHeld};
use kairos_wal::format::parse_segment_file_name;
use kairos_wal::{FsStorage, RecordPlace, RecordView, ScanReport, WalError};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Bad records described one by one; the rest are only counted.
const BAD_RECORDS_SHOWN: usize = 10;

/// Files listed by name per part of the directory; the rest are only counted.
const FILES_LISTED: usize = 50;

/// Summarize a data directory, offline and read-only.
#[derive(Debug, Args)]
#[command(long_about = "\
Summarize a data directory, offline and read-only.

DIR is an engine data directory (its log is DIR/wal) or a log directory itself (a data \
directory's wal/ given alone, beside a checkpoint or beside the engine's LOCK file and a \
checkpoint/ directory, is read as its data directory, with the checkpoint and the overflow \
files beside it; a log read alone that was trimmed — its first LSN above 1, the records \
before it held by a checkpoint that is not there — fails as a data directory whose checkpoint is \
missing does). Prints:

- the checkpoint the engine's open would start from — the newest file in DIR/checkpoint that \
reads back whole: its file, LSN, creation time, size in bytes, the live tasks (and of those, \
how many payloads it places in overflow files), the far tasks (beyond the far span: only their \
id, key hash and overflow entry are in the checkpoint) and dead letters it holds; every \
checkpoint file present (an older one may be left beside the newest after a crash) and \
leftover *.tmp files. The records above its LSN are replayed on its state; \
those at or below it are only counted (the engine skips them);
- the log's segments: name, size in bytes, records, first and last LSN, sealed or active, and \
their live fraction;
- whether the last shutdown was clean, up to which LSN the log is known durable (its \
high-water marks: CLOSED at a clean close, SYNCED at each segment roll, each open and when \
appends paused; damage at or below it \
is corruption), and a torn tail if there is one (an unsynced write cut short by a crash, \
which the next open truncates: reported, not damage); a torn mark slot of the newest segment \
(what a crash while it was being written leaves; the next open rewrites it as empty) is a \
WARNING naming the file and byte offset, not damage;
- the pending tasks by state, replayed with the engine's own rules: waiting (for their first \
delivery or their next attempt), in flight (delivered, not yet acked, retried, dead-lettered, \
released or cancelled), and dead letters; of the waiting, those far (beyond the far span: key, \
due time and payload only in their overflow entry, read when a record after the checkpoint \
names the task); and of the live tasks, those whose payload is in memory (the checkpoint \
holds it, or a record after it does) and those whose payload is in an overflow file (far \
tasks included);
- the overflow files (DIR/overflow): per file, its size in bytes, its entries, its live entries \
(the payloads of tasks live at the end of the log: the checkpoint places them there and no \
RESCHEDULE after it carries a new payload; and the entries of far tasks still live), its dead \
fraction and the due times of its first and last entry; their totals; orphans (files the \
checkpoint the engine's open starts from does not name — every file, without a checkpoint: the \
engine removes them, at the next open, or at the next checkpoint when the newest checkpoint \
file is damaged) and leftover *.tmp files. Each file is read whole and checked (header, every entry's \
CRC, an entry wherever the checkpoint places a payload, and wherever it places a far task an \
entry of that task whose key hashes to the checkpoint's key hash). The payload window \
(Config::payload_window), which decides which payloads move there, is an engine setting, not \
stored in the directory: it is not shown;
- the bytes each part of the directory uses: the log's segments, the log's other files, and \
every other file found under DIR, by top-level subdirectory.

The live fraction of a segment is the bytes of its SCHEDULE and RESCHEDULE records (record \
header and body) that are the latest schedule of a task still live at the end of the log, \
divided by the segment's size: the part of the segment a compaction would have to keep. A task \
the checkpoint holds whose schedule is no longer in the log counts toward no segment.

On a damaged directory, prints what it could read before the damage (the counts are then as \
of the last record read) and where the damage is: file and byte offset. A newest checkpoint \
that does not read back is damage, unless an older one reads and the log still holds every \
record after it: the engine then opens from the older one, and so does inspect, reporting the \
newest one's damage as a warning (not past a file that could not be read at all, an I/O \
error: the engine's open fails on it). If no checkpoint reads, the log is not read (the task counts \
are unknown). A damaged or missing overflow file is named the same way (file, and byte offset \
of the damaged header or entry), without stopping the rest: the log is read whole. A damaged \
orphan is a WARNING, not damage: the engine removes it, and nothing needs it (verify reports it \
alike).

Exit status 0 when the checkpoint reads, the log holds every record after it, the whole log \
reads, every record above the checkpoint decodes and replays (a torn tail included), and every \
overflow file reads back whole and holds the payloads the checkpoint places there; 1 if a \
checkpoint, the log or an overflow file the checkpoint names is damaged, a record is bad, an \
entry named like a log segment, a checkpoint or an overflow file is not a regular file (a FIFO, \
a directory: the engine passes over it), a LOCK is a directory or a dangling link (the engine's open cannot lock \
it), the log was trimmed and the checkpoint that covered its start is missing, or the directory cannot \
be read.")]
pub struct InspectArgs {
    /// Data directory (or its `wal` log directory).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Largest record body accepted, bytes: a longer length field is damage. At least 23
    /// (the smallest SCHEDULE body).
    #[arg(long, value_name = "B", default_value_t = kairos_wal::RECORD_BYTES_MAX_DEFAULT,
          value_parser = super::verify::parse_record_bytes_max)]
    record_bytes_max: u32,
}

/// The whole summary, printed as text or JSON.
#[derive(Debug, Serialize)]
pub(crate) struct Inspection {
    /// The directory inspected, as given.
    dir: PathBuf,
    /// Its log directory.
    log_dir: PathBuf,
    /// Whether the whole log reads and every record decodes and replays.
    ok: bool,
    /// Why the directory could not be read to its end: the damage (file, offset) of the
    /// checkpoint or the log, or an error.
    error: Option<Failure>,
    /// Damage the engine's open would only warn about: the newest checkpoint file does not
    /// read back, but an older one does and the log still holds every record after it.
    warnings: Vec<Failure>,
    /// The log's segments, oldest first. If the scan stopped at damage, the segments
    /// whose records were read before it (`sealed` then unknown).
    segments: Vec<SegmentSummary>,
    /// Segments below the `TRIM` mark, left over by an interrupted removal: not read
    /// (the next open removes them).
    leftover_segments: Vec<PathBuf>,
    /// Records read (up to the damage, if any).
    records: u64,
    /// Records per type, in type order (types with none left out).
    record_types: Vec<TypeCount>,
    /// First LSN of the log (0 if none was read).
    first_lsn: u64,
    /// Last LSN read (0 if none).
    last_lsn: u64,
    /// Whether the log ends with a clean-close marker (`None`: unknown, the scan stopped at
    /// damage before the end).
    clean_shutdown: Option<bool>,
    /// The highest LSN the log's high-water marks (`CLOSED`, `SYNCED`) record as durable: damage
    /// at or below it is corruption, never a torn tail (0: none recorded; `None`: unknown, the
    /// scan stopped at damage before it read them).
    durable_lsn: Option<u64>,
    /// An unsynced torn tail the next open would truncate.
    torn_tail: Option<Torn>,
    /// Pending tasks by state, at `last_lsn` (`None`: unknown, no checkpoint reads).
    tasks: Option<TaskCounts>,
    /// Records whose body does not decode or does not replay.
    bad_records: u64,
    /// The first few of them.
    bad_record_details: Vec<BadRecord>,
    /// Bytes used by each part of the directory.
    disk: DiskUsage,
    /// The checkpoint the replay started from (`None`: none, or none reads).
    checkpoint: Option<CheckpointSummary>,
    /// Every checkpoint file in `DIR/checkpoint/`, by LSN ascending.
    checkpoint_files: Vec<CheckpointFile>,
    /// Leftover temporary checkpoint files (`*.tmp`): a checkpoint being written when the
    /// engine stopped; the next open removes them.
    checkpoint_tmp_files: Vec<TmpFile>,
    /// The overflow files (`DIR/overflow/`; `None` when a log directory was given). The
    /// payload window that decides which payloads move there (`Config::payload_window`) is
    /// an engine setting, not stored in the directory: it cannot be known here.
    overflow: Option<OverflowSummary>,
    /// Whether `error` stopped the reading of the checkpoint or the log (the counts are then
    /// as of the last record read), rather than being an overflow file's damage.
    #[serde(skip)]
    log_stopped: bool,
    /// Entries named like a log segment, a checkpoint or an overflow file that are not
    /// regular files (a FIFO, a directory, …): the engine passes over them. Each fails the
    /// inspection.
    not_regular_files: Vec<Failure>,
    /// Which of `warnings` is the newest checkpoint's damage (the engine then opens from an
    /// older one).
    #[serde(skip)]
    newer_checkpoint_warning: Option<usize>,
}

/// The overflow files: payloads of tasks not due soon, which a checkpoint moved out of
/// memory (`wal/FORMAT.md`, "Overflow files").
#[derive(Debug, Serialize)]
struct OverflowSummary {
    /// `DIR/overflow`.
    dir: PathBuf,
    /// Every overflow file, by number: those present, and any the checkpoint refers to that
    /// is missing (then damaged).
    files: Vec<OverflowFile>,
    /// Leftover temporary files (`*.tmp`): an overflow file being written when the engine
    /// stopped; the next open removes them.
    tmp_files: Vec<TmpFile>,
    /// The files' totals.
    total: OverflowTotal,
}

/// One overflow file.
#[derive(Debug, Serialize)]
struct OverflowFile {
    file: PathBuf,
    /// Its number (the name's).
    number: u32,
    /// Size in bytes (`null`: missing or unreadable).
    bytes: Option<u64>,
    /// Entries (payloads) it holds (`null`: it does not read back).
    entries: Option<u64>,
    /// Of those, the payloads of live tasks: tasks the checkpoint places here that are live
    /// at `Inspection::last_lsn` and were not rescheduled with a new payload since (`null`:
    /// the tasks are unknown).
    live_entries: Option<u64>,
    /// Bytes of the live entries (`null`: unknown).
    live_bytes: Option<u64>,
    /// `1 - live_entries / entries` (0 for a file without entries; `null`: unknown): the
    /// measure the engine compacts a file by.
    dead_fraction: Option<f64>,
    /// Due time of its first and last entry, UTC ms (`null`: no entries, or unknown). An
    /// entry's due time is its task's when the file was written.
    first_due_ms: Option<u64>,
    /// The same in RFC 3339 (`null` past the year 9999 too).
    first_due: Option<String>,
    last_due_ms: Option<u64>,
    last_due: Option<String>,
    /// The checkpoint the engine's open starts from does not name it (every file is an
    /// orphan without a checkpoint): the engine removes it — at the next open, or at the
    /// next checkpoint when the newest checkpoint file is damaged — so its damage is a
    /// warning, not a failure (`null`: unknown, no checkpoint reads). A file the checkpoint
    /// names whose entries are all dead is no orphan: the open keeps it, the next
    /// checkpoint removes it.
    orphan: Option<bool>,
    /// Why it does not read back, or does not hold a payload where the checkpoint puts it:
    /// the file and the byte offset.
    damage: Option<Failure>,
}

/// The totals of the overflow files.
#[derive(Debug, Default, Serialize)]
struct OverflowTotal {
    files: usize,
    /// Bytes of the files that could be read.
    bytes: u64,
    /// Entries of the files that read back.
    entries: u64,
    /// Live entries (`null`: the tasks are unknown).
    live_entries: Option<u64>,
    /// Their bytes (`null`: unknown).
    live_bytes: Option<u64>,
    /// `1 - live_entries / entries`, over the files that read back (`null`: unknown).
    dead_fraction: Option<f64>,
    /// The earliest and latest due time of any entry.
    first_due_ms: Option<u64>,
    first_due: Option<String>,
    last_due_ms: Option<u64>,
    last_due: Option<String>,
    /// Orphan files: no checkpoint the engine uses names them (`null`: unknown).
    orphan_files: Option<usize>,
    /// Files that do not read back or lack a payload the checkpoint puts there.
    damaged_files: usize,
}

/// The checkpoint the replay started from.
#[derive(Debug, Serialize)]
struct CheckpointSummary {
    /// Path of the file.
    file: PathBuf,
    /// It holds the state after every record up to this LSN.
    lsn: u64,
    /// Its creation time, UTC ms (wall clock of the writer; for humans only).
    created_ms: u64,
    /// The same in RFC 3339 (`null` past the year 9999).
    created: Option<String>,
    /// Size in bytes.
    bytes: u64,
    /// The largest task id assigned up to `lsn`.
    max_task_id: u64,
    /// Live tasks it holds whole (far tasks apart).
    tasks: usize,
    /// Of those, the tasks whose payload it places in an overflow file.
    payloads_in_overflow: usize,
    /// Far tasks it holds (beyond the far span: id, key hash and overflow entry only).
    far_tasks: usize,
    /// Dead letters it holds.
    dead_letters: usize,
}

/// A checkpoint file present.
#[derive(Debug, Serialize)]
struct CheckpointFile {
    file: PathBuf,
    /// The LSN its name says.
    lsn: u64,
    /// Size in bytes (`null` if it cannot be read).
    bytes: Option<u64>,
}

/// A leftover temporary checkpoint file.
#[derive(Debug, Serialize)]
struct TmpFile {
    file: PathBuf,
    /// Size in bytes (`null` if it cannot be read).
    bytes: Option<u64>,
}

/// One log segment.
#[derive(Debug, Serialize)]
struct SegmentSummary {
    /// Path of the segment file.
    file: PathBuf,
    /// Size in bytes.
    bytes: u64,
    /// Records read in it.
    records: u64,
    /// LSN of its first record (or the one it would have).
    first_lsn: u64,
    /// LSN of its last record read (`first_lsn - 1` if none).
    last_lsn: u64,
    /// Whether it ends with a SEAL frame (`None`: unknown, the scan stopped at damage).
    sealed: Option<bool>,
    /// Bytes of its SCHEDULE and RESCHEDULE records that are the latest schedule of a
    /// task live at `Inspection::last_lsn`.
    live_bytes: u64,
    /// `live_bytes / bytes` (0 for an empty file).
    live_fraction: f64,
}

/// Records of one type.
#[derive(Debug, Serialize)]
struct TypeCount {
    /// `SCHEDULE`, …, or `UNKNOWN(n)`.
    #[serde(rename = "type")]
    type_name: String,
    count: u64,
}

/// Pending tasks by state, replayed with the engine's rules.
#[derive(Debug, Default, Serialize)]
struct TaskCounts {
    /// Live tasks: `waiting + in_flight`.
    live: usize,
    /// Waiting for their first delivery or their next attempt (far tasks included).
    waiting: usize,
    /// Of the waiting, far tasks: beyond the far span when the checkpoint was written, their key,
    /// due time and payload only in their overflow entry, and no record after the checkpoint
    /// has named them.
    far: usize,
    /// Delivered and not settled (no ACK, RETRY, DEAD, RELEASE or CANCEL yet): the
    /// next open settles them.
    in_flight: usize,
    /// Dead letters kept.
    dead_letters: usize,
    /// Live tasks whose payload is in memory: the checkpoint holds it, or a SCHEDULE or a
    /// RESCHEDULE logged after it does.
    payload_in_memory: usize,
    /// Live tasks whose payload is in an overflow file: the checkpoint places it there (far
    /// tasks included), and no RESCHEDULE after it carries a new one.
    payload_in_overflow: usize,
}

#[derive(Debug, Serialize)]
struct BadRecord {
    lsn: u64,
    /// The segment holding it.
    file: PathBuf,
    #[serde(rename = "type")]
    type_name: String,
    reason: String,
}

/// Bytes used under the directory.
#[derive(Debug, Default, Serialize)]
struct DiskUsage {
    /// Every file under the directory (symbolic links not followed).
    total_bytes: u64,
    total_files: u64,
    /// The log's segment files.
    wal_segment_bytes: u64,
    wal_segment_files: u64,
    /// By top-level entry of the directory: `wal/` (segments included in its bytes but
    /// not listed), then each other subdirectory (`checkpoint/`, `overflow/`, …), then
    /// `.` for the files directly in the directory.
    parts: Vec<Part>,
    /// Directories or files that could not be read.
    unreadable: Vec<String>,
}

/// One top-level part of the directory.
#[derive(Debug, Serialize)]
struct Part {
    /// `NAME/` for a subdirectory, `.` for the files directly in the directory.
    name: String,
    /// Bytes of all its files.
    bytes: u64,
    /// Its files.
    files: u64,
    /// Of those, the log's segment files (counted, not listed).
    segment_files: u64,
    /// Its other files, in path order (at most 50; the rest are counted in `files` and
    /// `bytes` only).
    listed: Vec<FileUsage>,
}

#[derive(Debug, Serialize)]
struct FileUsage {
    /// Path relative to the directory.
    path: String,
    bytes: u64,
}

/// Runs the inspection and prints it.
pub fn run(args: &InspectArgs) -> anyhow::Result<Verdict> {
    let (data_dir, log_dir) = dirs(&args.dir, "inspect")?;
    let mut inspection = inspect(&data_dir, log_dir, args.record_bytes_max);
    inspection.not_regular_files = not_regular_files(&data_dir, &inspection.log_dir);
    inspection.ok &= inspection.not_regular_files.is_empty();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        inspection.print();
    }
    if let Some(error) = &inspection.error {
        errln!("kairos inspect: {}", error.message);
    }
    for f in &inspection.not_regular_files {
        errln!("kairos inspect: {}", f.message);
    }
    Ok(if inspection.ok {
        Verdict::Pass
    } else {
        Verdict::Fail
    })
}

/// Reads the checkpoint of `dir` (when `log_dir` is its `wal/`), the log of `log_dir`,
/// and the files under `dir`.
fn inspect(dir: &Path, log_dir: PathBuf, record_bytes_max: u32) -> Inspection {
    let disk = disk_usage(dir, &log_dir);
    // As `verify` does: a log directory given by itself is read without a checkpoint.
    let checkpoint_dir = (log_dir != dir).then(|| dir.join(ckpt::CHECKPOINT_DIR_NAME));
    let (checkpoint_files, checkpoint_tmp_files) = checkpoint_dir
        .as_deref()
        .map_or_else(Default::default, list_checkpoints);
    // The overflow files are read below, each once, after the log: their damage does not
    // stop the reading of the log.
    let start = match checkpoint_dir.as_deref() {
        Some(d) => start_from_checkpoint_deferring_overflow(&FsStorage, d, &log_dir),
        None => Ok(None),
    };
    let overflow_dir = checkpoint_dir
        .is_some()
        .then(|| dir.join(ovf::OVERFLOW_DIR_NAME));
    let far = FarReader::new(&FsStorage, start.as_ref().ok().and_then(Option::as_ref));
    let mut start = match start {
        Ok(start) => start,
        // The replay has nowhere to start from (the engine would not open): the log is
        // not read.
        Err(failure) => {
            let (mut inspection, _, _, _) = Reader::new(0, Replay::new(false), far).finish(
                dir,
                log_dir,
                Ok(ScanReport::default()),
                disk,
            );
            inspection.segments.clear();
            inspection.tasks = None;
            inspection.ok = false;
            inspection.error = Some(failure);
            inspection.checkpoint_files = checkpoint_files;
            inspection.checkpoint_tmp_files = checkpoint_tmp_files;
            inspection.log_stopped = true;
            if let Some(d) = overflow_dir {
                inspection.add_overflow(d, None, &[], (None, None), None);
            }
            return inspection;
        }
    };
    let mut reader = match start.as_mut() {
        Some(s) => Reader::new(s.summary.lsn, std::mem::take(&mut s.replay), far),
        None => Reader::new(0, Replay::new(false), far),
    };
    let scan = kairos_wal::scan_located(&FsStorage, &log_dir, record_bytes_max, &mut |v, p| {
        reader.visit(v, p)
    });
    let after = reader.after;
    let (mut inspection, live_refs, dead_refs, unresolved) =
        reader.finish(dir, log_dir, scan, disk);
    let mut refs = Vec::new();
    let mut store_id = None;
    // The files the open keeps: those the checkpoint names (or all, when the newest is damaged).
    let mut named = Some((Vec::new(), false));
    if let Some(mut s) = start {
        named = Some((std::mem::take(&mut s.named_files), s.newer_damage.is_some()));
        if inspection.error.is_none() {
            if let Err(failure) = s.check_log(inspection.last_lsn, after) {
                inspection.ok = false;
                inspection.error = Some(failure);
            }
        }
        inspection.checkpoint = Some(CheckpointSummary::new(&s));
        if let Some(damage) = s.newer_damage {
            inspection.newer_checkpoint_warning = Some(inspection.warnings.len());
            inspection.warnings.push(damage);
        }
        refs = s.overflow_refs;
        store_id = Some(s.store_id);
    } else if inspection.error.is_none() {
        let first = inspection
            .segments
            .first()
            .map(|s| (s.file.as_path(), s.first_lsn));
        if let Some(failure) = missing_checkpoint(first, checkpoint_dir.is_none()) {
            inspection.ok = false;
            inspection.error = Some(failure);
        }
    }
    inspection.checkpoint_files = checkpoint_files;
    inspection.checkpoint_tmp_files = checkpoint_tmp_files;
    inspection.log_stopped = inspection.error.is_some();
    if let Some(d) = overflow_dir {
        let named = named
            .as_ref()
            .map(|(files, kept)| (files.as_slice(), *kept));
        // Damage is judged against the tasks live at the end of the log only if it was read
        // whole.
        let judge = inspection.error.is_none().then_some(&dead_refs);
        inspection.add_overflow(d, store_id, &refs, (Some(&live_refs), judge), named);
    }
    // A far task a record after the checkpoint needed whole, its entry unread, live at the
    // end: the engine's open refuses the directory (the overflow check above names the entry
    // when it finds it damaged; this covers an entry that could not be read otherwise).
    if let Some(held) = unresolved.filter(|_| inspection.error.is_none()) {
        inspection.ok = false;
        inspection.error = Some(Failure {
            file: checkpoint_dir.as_deref().and_then(Path::parent).map(|d| {
                d.join(ovf::OVERFLOW_DIR_NAME)
                    .join(ovf::file_name(held.task.file))
            }),
            offset: Some(held.task.offset),
            message: held.to_string(),
            cause: Cause::Damage,
        });
    }
    inspection
}

/// Per overflow file, the offsets of the payloads of the tasks live at the end of the
/// replay.
type LiveRefs = BTreeMap<u32, Vec<u64>>;

impl Inspection {
    /// Reads every overflow file in `dir` (a data directory's `overflow/`), one at a time and
    /// each once, and fills in `overflow`: the entries of each file, its due range, and its
    /// live entries — the payloads of `live` (per file, the offsets the tasks live at the
    /// end of the replay refer to; `None`: the tasks are unknown). Each file must read back
    /// whole (header, entry CRCs, store id `store_id` if known, number) and hold every
    /// payload the checkpoint places there (`refs`, sorted by file and offset), as `kairos
    /// verify` checks; a damaged or missing file fails the inspection, naming the file and
    /// the byte offset — but for an orphan, a file the checkpoint does not name (`named`: the
    /// files it names, and whether the open keeps the others anyway, the newest checkpoint
    /// being damaged; `None`: unknown, no checkpoint reads), which the engine removes: its
    /// damage is a warning, as `verify` reports it. With `dead` (the offsets of dead letters'
    /// payloads, per file; given when the log was read whole), a file that does not read back
    /// whole is judged as `verify` judges it ([`DamagedOverflowFile::judge`]): a warning if
    /// no task or dead letter live at the end of the log needs what is damaged.
    fn add_overflow(
        &mut self,
        dir: PathBuf,
        store_id: Option<[u8; 16]>,
        refs: &[OverflowRef],
        (live, dead): (Option<&LiveRefs>, Option<&LiveRefs>),
        named: Option<(&[u32], bool)>,
    ) {
        let mut damages = Vec::new();
        let (files, tmps) = match ovf::list(&FsStorage, &dir) {
            Ok(listing) => listing,
            Err(e) => {
                damages.push(Failure {
                    cause: Cause::of_io(&e),
                    file: Some(dir.clone()),
                    offset: None,
                    message: format!("cannot list {}: {e}", dir.display()),
                });
                Default::default()
            }
        };
        // The files present, and any the checkpoint refers to that is not.
        let mut numbers: Vec<u32> = files.iter().map(|(n, _)| *n).collect();
        numbers.extend(refs.iter().map(|r| r.file));
        numbers.sort_unstable();
        numbers.dedup();
        let mut summaries = Vec::with_capacity(numbers.len());
        let hasher = store_id.as_ref().map(KeyHasher::new);
        for number in numbers {
            let path = dir.join(ovf::file_name(number));
            let at = refs.partition_point(|r| r.file < number);
            let end = refs.partition_point(|r| r.file <= number);
            let live_offsets = live.map(|l| l.get(&number).map_or(&[][..], Vec::as_slice));
            let orphan = named.map(|(files, _)| files.binary_search(&number).is_err());
            let summary = OverflowFile::read(
                path,
                (number, store_id.as_ref(), hasher.as_ref()),
                &refs[at..end],
                (live_offsets, orphan),
            );
            if let Some(d) = &summary.damage {
                let d = Failure {
                    cause: d.cause,
                    file: d.file.clone(),
                    offset: d.offset,
                    message: d.message.clone(),
                };
                if orphan == Some(true) {
                    let kept = named.is_some_and(|(_, kept)| kept);
                    self.warnings.push(orphan_damage(&summary.file, kept, d));
                } else if let (true, Some(live), Some(dead), Some(hasher)) =
                    (summary.entries.is_none(), live, dead, hasher.as_ref())
                {
                    // The file does not read back whole: a warning if no task live at the
                    // end of the log needs what is damaged (as `verify` judges it).
                    let offsets = |m: &LiveRefs| m.get(&number).cloned().unwrap_or_default();
                    let (live, dead) = (offsets(live), offsets(dead));
                    let mut needed = NeededEntries::new();
                    for r in &refs[at..end] {
                        let used_as = if dead.contains(&r.offset) {
                            EntryUse::DeadLetter
                        } else if !live.contains(&r.offset) {
                            continue;
                        } else if matches!(r.key, EntryKey::Hash(_)) {
                            EntryUse::FarTask
                        } else {
                            EntryUse::Payload
                        };
                        needed.insert((number, r.offset), (r.task_id, used_as));
                    }
                    let damaged = DamagedOverflowFile {
                        file: number,
                        path: summary.file.clone(),
                        missing: d.cause == Cause::Missing,
                        damage: d,
                        refs: refs[at..end]
                            .iter()
                            .map(|r| (r.offset, r.task_id, r.key.clone()))
                            .collect(),
                    };
                    match damaged.judge(&FsStorage, &needed, hasher) {
                        Ok(warning) => self.warnings.push(warning),
                        Err(failure) => damages.push(failure),
                    }
                } else {
                    damages.push(d);
                }
            }
            summaries.push(summary);
        }
        let mut tmp_files: Vec<TmpFile> = tmps
            .into_iter()
            .map(|name| {
                let file = dir.join(name);
                let bytes = std::fs::symlink_metadata(&file).ok().map(|m| m.len());
                TmpFile { file, bytes }
            })
            .collect();
        tmp_files.sort_by(|a, b| a.file.cmp(&b.file));
        let total = OverflowTotal::of(&summaries, live.is_some());
        if let Some(first) = damages.into_iter().next() {
            self.ok = false;
            self.error.get_or_insert(first);
        }
        self.overflow = Some(OverflowSummary {
            dir,
            files: summaries,
            tmp_files,
            total,
        });
    }
}

impl OverflowFile {
    /// Reads overflow file `number` at `path` and summarizes it; `refs` are the payloads and
    /// far tasks' entries the checkpoint places in it (a far task's key hash checked with
    /// `hasher`, the store id's), `live` the offsets of those of tasks still live (`None`:
    /// unknown), `orphan` whether the checkpoint does not name it (`None`: unknown).
    fn read(
        path: PathBuf,
        (number, store_id, hasher): (u32, Option<&[u8; 16]>, Option<&KeyHasher>),
        refs: &[OverflowRef],
        (live, orphan): (Option<&[u64]>, Option<bool>),
    ) -> OverflowFile {
        let live_entries = live.map(|l| l.len() as u64);
        let mut summary = OverflowFile {
            bytes: std::fs::symlink_metadata(&path).ok().map(|m| m.len()),
            file: path,
            number,
            entries: None,
            live_entries,
            live_bytes: None,
            dead_fraction: None,
            first_due_ms: None,
            first_due: None,
            last_due_ms: None,
            last_due: None,
            orphan,
            damage: None,
        };
        // The file's entries decoded (`read_file` checks every one of them, reading the file
        // through a window of about 1 MiB): about its size, for one file at a time — never
        // more than the entries that check, whatever its length. Fine for an offline summary;
        // the engine itself reads one entry at a time.
        let entries = match ovf::read_file(&FsStorage, &summary.file, store_id, Some(number)) {
            Ok(entries) => entries,
            Err(e) => {
                summary.damage = Some(Failure::overflow(&summary.file, &e));
                return summary;
            }
        };
        let checked = check_overflow_entries(
            &summary.file,
            &entries,
            refs.iter().map(|r| (r.offset, r.task_id, r.key.as_deref())),
            hasher,
        );
        if let Err(failure) = checked {
            summary.damage = Some(failure);
        }
        let n = entries.len() as u64;
        summary.entries = Some(n);
        let due = |i: Option<&(u64, ovf::Entry)>| i.map(|(_, e)| e.due_ms);
        summary.first_due_ms = due(entries.first());
        summary.last_due_ms = due(entries.last());
        summary.first_due = summary.first_due_ms.and_then(rfc3339);
        summary.last_due = summary.last_due_ms.and_then(rfc3339);
        if let (Some(live), None) = (live, &summary.damage) {
            // Every live offset is one the checkpoint placed here, and the check above found
            // an entry at each.
            let entry_bytes = |offset: &u64| {
                entries
                    .binary_search_by_key(offset, |(o, _)| *o)
                    .ok()
                    .map_or(0, |i| {
                        let e = &entries[i].1;
                        (ovf::ENTRY_FIXED_BYTES + e.key.len() + e.payload.len()) as u64
                    })
            };
            summary.live_bytes = Some(live.iter().map(entry_bytes).sum());
            summary.dead_fraction = Some(dead_fraction(live.len() as u64, n));
        }
        summary
    }
}

/// `1 - live / entries`, 0 without entries.
fn dead_fraction(live: u64, entries: u64) -> f64 {
    if entries == 0 {
        0.0
    } else {
        entries.saturating_sub(live) as f64 / entries as f64
    }
}

impl OverflowTotal {
    /// The totals of `files`; `tasks_known`: whether their live entries are known.
    fn of(files: &[OverflowFile], tasks_known: bool) -> OverflowTotal {
        let mut t = OverflowTotal {
            files: files.len(),
            ..OverflowTotal::default()
        };
        let (mut live, mut live_bytes, mut orphans) = (0, 0, 0);
        for f in files {
            t.bytes += f.bytes.unwrap_or(0);
            t.entries += f.entries.unwrap_or(0);
            live += f.live_entries.unwrap_or(0);
            live_bytes += f.live_bytes.unwrap_or(0);
            orphans += usize::from(f.orphan == Some(true));
            t.damaged_files += usize::from(f.damage.is_some());
            if let Some(first) = f.first_due_ms {
                t.first_due_ms = Some(t.first_due_ms.map_or(first, |m| m.min(first)));
            }
            t.last_due_ms = t.last_due_ms.max(f.last_due_ms);
        }
        t.first_due = t.first_due_ms.and_then(rfc3339);
        t.last_due = t.last_due_ms.and_then(rfc3339);
        if tasks_known {
            t.live_entries = Some(live);
            t.orphan_files = Some(orphans);
            if t.damaged_files == 0 {
                t.live_bytes = Some(live_bytes);
                t.dead_fraction = Some(dead_fraction(live, t.entries));
            }
        }
        t
    }
}

/// The checkpoint files and leftover temporary files in `dir`, with their sizes. A listing
/// error leaves both empty (`start_from_checkpoint` reports it).
fn list_checkpoints(dir: &Path) -> (Vec<CheckpointFile>, Vec<TmpFile>) {
    let Ok((files, tmps)) = ckpt::list(&FsStorage, dir) else {
        return Default::default();
    };
    let size = |path: &Path| std::fs::symlink_metadata(path).ok().map(|m| m.len());
    let files = files
        .into_iter()
        .map(|(lsn, name)| {
            let file = dir.join(name);
            let bytes = size(&file);
            CheckpointFile { file, lsn, bytes }
        })
        .collect();
    let mut tmps: Vec<TmpFile> = tmps
        .into_iter()
        .map(|name| {
            let file = dir.join(name);
            let bytes = size(&file);
            TmpFile { file, bytes }
        })
        .collect();
    tmps.sort_by(|a, b| a.file.cmp(&b.file));
    (files, tmps)
}

impl CheckpointSummary {
    fn new(s: &CheckpointStart) -> CheckpointSummary {
        CheckpointSummary {
            file: s.summary.file.clone(),
            lsn: s.summary.lsn,
            created_ms: s.created_ms,
            created: rfc3339(s.created_ms),
            bytes: s.bytes,
            max_task_id: s.max_task_id,
            tasks: s.summary.tasks,
            payloads_in_overflow: s
                .overflow_refs
                .iter()
                .filter(|r| matches!(r.key, EntryKey::Key(_)))
                .count(),
            far_tasks: s.summary.far_tasks,
            dead_letters: s.summary.dead_letters,
        }
    }
}

/// Replays the records as the scan hands them over.
struct Reader {
    /// Records at or below this LSN (the checkpoint's) are counted, not replayed.
    covered: u64,
    /// Records read above `covered`.
    after: u64,
    replay: Replay,
    /// Reads the key and due time of a far task a record names.
    far: FarReader<'static>,
    /// Segments whose records were read, in order.
    tallies: Vec<Tally>,
    /// Per live task: the segment (index in `tallies`) and bytes of its latest
    /// SCHEDULE or RESCHEDULE record.
    latest: HashMap<u64, (usize, u64)>,
    records: u64,
    types: [u64; 256],
    bad: u64,
    bad_details: Vec<BadRecord>,
}

impl Reader {
    /// A reader replaying the records above `covered` on `replay` (its far tasks read with
    /// `far`).
    fn new(covered: u64, replay: Replay, far: FarReader<'static>) -> Reader {
        Reader {
            covered,
            after: 0,
            replay,
            far,
            tallies: Vec::new(),
            latest: HashMap::new(),
            records: 0,
            types: [0; 256],
            bad: 0,
            bad_details: Vec::new(),
        }
    }
}

impl Reader {
    fn visit(&mut self, view: RecordView<'_>, place: RecordPlace<'_>) {
        let lsn = view.lsn.0;
        self.records += 1;
        self.types[usize::from(view.record_type)] += 1;
        let index = Tally::count(&mut self.tallies, place.file, lsn);
        let record_bytes = (kairos_wal::format::RECORD_HEADER_BYTES + view.body.len()) as u64;
        if lsn <= self.covered {
            // The checkpoint holds the effect of this record, and the engine's open skips
            // it: not replayed, and not bad if it does not decode. Only where a task's
            // latest schedule lies is taken from it (for the live fraction).
            if let Ok(record) = Record::decode(view.record_type, view.body) {
                self.track_latest(&record, index, record_bytes);
            }
            return;
        }
        self.after += 1;
        let outcome = Record::decode(view.record_type, view.body)
            .map_err(|e| e.to_string())
            .and_then(|record| {
                let far = &self.far;
                self.replay
                    .apply_with(&record, &mut |t| far.read(t))
                    .map_err(|e| e.to_string())?;
                Ok(record)
            });
        match outcome {
            // Kept in step with the replay: only records it accepted count.
            Ok(record) => self.track_latest(&record, index, record_bytes),
            Err(reason) => {
                self.bad += 1;
                if self.bad_details.len() < BAD_RECORDS_SHOWN {
                    self.bad_details.push(BadRecord {
                        lsn,
                        file: place.file.to_path_buf(),
                        type_name: type_name(view.record_type).into_owned(),
                        reason,
                    });
                }
            }
        }
    }

    /// Notes where the latest SCHEDULE or RESCHEDULE of each task lies (segment `index`,
    /// `record_bytes`), and forgets the tasks a record finishes.
    fn track_latest(&mut self, record: &Record<'_>, index: usize, record_bytes: u64) {
        match *record {
            Record::Schedule { id, .. } | Record::Reschedule { id, .. } => {
                self.latest.insert(id.0, (index, record_bytes));
            }
            Record::Cancel { id } | Record::Ack { id } | Record::Dead { id, .. } => {
                self.latest.remove(&id.0);
            }
            Record::Deliver { .. }
            | Record::Retry { .. }
            | Record::Purge { .. }
            | Record::Release { .. } => {}
        }
    }

    /// The summary, and where the payloads of the tasks live at the end are in overflow
    /// files.
    fn finish(
        mut self,
        dir: &Path,
        log_dir: PathBuf,
        scan: Result<ScanReport, WalError>,
        disk: DiskUsage,
    ) -> (Inspection, LiveRefs, LiveRefs, Option<StillHeld>) {
        let (report, error) = match scan {
            Ok(report)
                if report.segments.is_empty() && !Failure::log_creation_cut_short(&log_dir) =>
            {
                let failure = Failure::no_log(&log_dir);
                (Some(report), Some(failure))
            }
            Ok(report) => (Some(report), None),
            Err(e) => (None, Some(Failure::from(&e))),
        };
        let mut replay = std::mem::take(&mut self.replay);
        let in_overflow = replay.tasks().filter(|t| t.payload_at.is_some()).count();
        let far = replay.far_tasks();
        let tasks = TaskCounts {
            live: replay.live_tasks(),
            in_flight: replay.tasks().filter(|t| t.in_flight).count(),
            waiting: replay.tasks().filter(|t| !t.in_flight).count() + far,
            far,
            dead_letters: replay.dead_letters(),
            payload_in_memory: replay.live_tasks() - in_overflow - far,
            payload_in_overflow: in_overflow + far,
        };
        // Dead letters whose payload is still in an overflow file: what the engine's open
        // reads (not counted as live entries here).
        let mut dead_refs = LiveRefs::new();
        for &(file, offset) in replay.dead_payloads_on_disk().values() {
            dead_refs.entry(file).or_default().push(offset);
        }
        // Far tasks a record needed whole whose entry did not read, still live: their key is
        // only in that entry (whatever payload they were given since).
        let unresolved = replay.unresolved_at_end().err();
        let unread: Vec<(u32, u64)> = replay
            .unresolved_live()
            .filter(|u| !replay.is_dead_letter(u.id))
            .map(|u| (u.file, u.offset))
            .collect();
        // Sorted by id.
        let far_tasks = replay.take_far();
        let (live, _) = replay.into_parts();
        let mut live_refs = LiveRefs::new();
        for (_, t) in &live {
            if let Some((file, offset)) = t.payload_at {
                live_refs.entry(file).or_default().push(offset);
            }
        }
        for (file, offset) in unread {
            let offsets = live_refs.entry(file).or_default();
            if !offsets.contains(&offset) {
                offsets.push(offset);
            }
        }
        for t in &far_tasks {
            live_refs.entry(t.file).or_default().push(t.offset);
        }
        let is_far = |id: &u64| far_tasks.binary_search_by_key(id, |t| t.id).is_ok();
        let live: std::collections::HashSet<u64> = live.into_iter().map(|(id, _)| id).collect();
        let mut live_bytes = vec![0u64; self.tallies.len()];
        for (id, (index, bytes)) in &self.latest {
            if live.contains(id) || is_far(id) {
                if let Some(total) = live_bytes.get_mut(*index) {
                    *total += bytes;
                }
            }
        }
        let index_of: HashMap<&Path, usize> = self
            .tallies
            .iter()
            .enumerate()
            .map(|(i, t)| (t.file.as_path(), i))
            .collect();
        let live_of = |file: &Path| index_of.get(file).map_or(0, |&i| live_bytes[i]);
        let damaged = error.as_ref().and_then(|e| e.file.as_deref());
        let segments: Vec<SegmentSummary> = match &report {
            Some(report) => report
                .segments
                .iter()
                .map(|s| {
                    SegmentSummary::new(
                        s.file.clone(),
                        s.bytes,
                        s.records,
                        (s.first_lsn.0, s.last_lsn.0),
                        Some(s.sealed),
                        live_of(&s.file),
                    )
                })
                .collect(),
            // The scan stopped at damage. It reads segments in order and checks each one
            // whole (ending with SEAL) before it reads the next: every segment read is sealed
            // but the damaged one (listed if records were read from it before the damage).
            None => self
                .tallies
                .iter()
                .map(|t| {
                    let bytes = std::fs::metadata(&t.file).map_or(0, |m| m.len());
                    SegmentSummary::new(
                        t.file.clone(),
                        bytes,
                        t.records,
                        (t.first_lsn, t.last_lsn),
                        (damaged != Some(t.file.as_path())).then_some(true),
                        live_of(&t.file),
                    )
                })
                .collect(),
        };
        let record_types = self
            .types
            .iter()
            .enumerate()
            .filter(|&(_, &n)| n > 0)
            .map(|(t, &count)| TypeCount {
                type_name: type_name(t as u8).into_owned(),
                count,
            })
            .collect();
        let first_lsn = match &report {
            Some(r) => r.segments.first().map_or(0, |s| s.first_lsn.0),
            None => self.tallies.first().map_or(0, |t| t.first_lsn),
        };
        let last_lsn = match &report {
            Some(r) => r.last_lsn.0,
            None => self.tallies.last().map_or(0, |t| t.last_lsn),
        };
        let inspection = Inspection {
            dir: dir.to_path_buf(),
            log_dir,
            ok: error.is_none() && self.bad == 0,
            error,
            segments,
            leftover_segments: report
                .as_ref()
                .map_or_else(Vec::new, |r| r.leftover_segments.clone()),
            records: self.records,
            record_types,
            first_lsn,
            last_lsn,
            clean_shutdown: report.as_ref().map(|r| r.clean_shutdown),
            durable_lsn: report.as_ref().map(|r| r.high_water_lsn.0),
            torn_tail: report
                .as_ref()
                .and_then(|r| r.torn_tail.as_ref())
                .map(Torn::from),
            tasks: Some(tasks),
            bad_records: self.bad,
            bad_record_details: self.bad_details,
            disk,
            warnings: report
                .as_ref()
                .and_then(Failure::torn_mark_slot)
                .into_iter()
                .collect(),
            checkpoint: None,
            checkpoint_files: Vec::new(),
            checkpoint_tmp_files: Vec::new(),
            overflow: None,
            log_stopped: false,
            newer_checkpoint_warning: None,
            not_regular_files: Vec::new(),
        };
        (inspection, live_refs, dead_refs, unresolved)
    }
}

impl SegmentSummary {
    fn new(
        file: PathBuf,
        bytes: u64,
        records: u64,
        (first_lsn, last_lsn): (u64, u64),
        sealed: Option<bool>,
        live_bytes: u64,
    ) -> SegmentSummary {
        SegmentSummary {
            file,
            bytes,
            records,
            first_lsn,
            last_lsn,
            sealed,
            live_bytes,
            live_fraction: if bytes == 0 {
                0.0
            } else {
                live_bytes as f64 / bytes as f64
            },
        }
    }
}

/// Walks `dir` (symbolic links not followed, each directory's entries in name order)
/// and adds up its files by top-level entry.
fn disk_usage(dir: &Path, log_dir: &Path) -> DiskUsage {
    let mut usage = DiskUsage::default();
    let mut top = Part::new(".".to_string());
    let mut parts = Vec::new();
    for (path, name) in sorted_entries(dir, &mut usage.unreadable) {
        match std::fs::symlink_metadata(&path) {
            // A log directory given by itself (or a directory that is no Kairos directory at
            // all, `/` say) has no subdirectories of Kairos's: they are not walked.
            Ok(meta) if meta.is_dir() && dir == log_dir => {}
            Ok(meta) if meta.is_dir() => {
                let mut part = Part::new(format!("{name}/"));
                walk(dir, &path, log_dir, &mut part, &mut usage);
                parts.push(part);
            }
            Ok(meta) => usage.add(dir, &path, meta.len(), log_dir, &mut top),
            Err(e) => usage.unreadable.push(format!("{}: {e}", path.display())),
        }
    }
    // The log first, then the other parts by name, then the loose files.
    parts.sort_by_key(|p| (p.name != "wal/", p.name.clone()));
    if top.files > 0 {
        parts.push(top);
    }
    usage.parts = parts;
    usage
}

/// Adds every file under `root` to `part`, depth first in name order. Iterative: a
/// deep tree cannot overflow the stack.
fn walk(dir: &Path, root: &Path, log_dir: &Path, part: &mut Part, usage: &mut DiskUsage) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(next) = stack.pop() {
        let mut subdirs = Vec::new();
        for (path, _) in sorted_entries(&next, &mut usage.unreadable) {
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => subdirs.push(path),
                Ok(meta) => usage.add(dir, &path, meta.len(), log_dir, part),
                Err(e) => usage.unreadable.push(format!("{}: {e}", path.display())),
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
}

/// The entries of `dir` with their names (lossily), sorted by name.
fn sorted_entries(dir: &Path, unreadable: &mut Vec<String>) -> Vec<(PathBuf, String)> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            unreadable.push(format!("{}: {e}", dir.display()));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => {
                let name = entry.file_name().to_string_lossy().into_owned();
                out.push((entry.path(), name));
            }
            Err(e) => unreadable.push(format!("{}: {e}", dir.display())),
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

impl DiskUsage {
    /// Counts file `path` of `bytes` bytes in `part`; lists it unless it is a segment of
    /// the log (those are counted apart) or the part has listed enough.
    fn add(&mut self, dir: &Path, path: &Path, bytes: u64, log_dir: &Path, part: &mut Part) {
        self.total_bytes += bytes;
        self.total_files += 1;
        part.bytes += bytes;
        part.files += 1;
        let is_segment = path.parent() == Some(log_dir)
            && path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_segment_file_name)
                .is_some();
        if is_segment {
            self.wal_segment_bytes += bytes;
            self.wal_segment_files += 1;
            part.segment_files += 1;
        } else if part.listed.len() < FILES_LISTED {
            let relative = path.strip_prefix(dir).unwrap_or(path);
            part.listed.push(FileUsage {
                path: relative.to_string_lossy().into_owned(),
                bytes,
            });
        }
    }
}

impl Part {
    fn new(name: String) -> Part {
        Part {
            name,
            bytes: 0,
            files: 0,
            segment_files: 0,
            listed: Vec::new(),
        }
    }
}

impl Inspection {
    fn print(&self) {
        outln!("data directory  {}", self.dir.display());
        outln!("log directory   {}", self.log_dir.display());
        self.print_checkpoint();
        if self.tasks.is_some() {
            self.print_log();
        } else {
            outln!("log             not read: replay starts from a checkpoint, and none reads");
        }
        self.print_tasks();
        self.print_overflow();
        self.print_disk();
        self.print_verdict();
    }

    fn print_checkpoint(&self) {
        match &self.checkpoint {
            Some(c) => outln!(
                "checkpoint      {} at LSN {}, created {}, {} bytes: {}, {} (largest task id \
                 {}); the log is replayed above LSN {}",
                file_name(&c.file),
                c.lsn,
                c.created
                    .clone()
                    .unwrap_or_else(|| format!("at {} ms", c.created_ms)),
                c.bytes,
                plural(c.tasks as u64, "live task", "live tasks")
                    + &if c.far_tasks > 0 {
                        format!(", {}", plural(c.far_tasks as u64, "far task", "far tasks"))
                    } else {
                        String::new()
                    },
                plural(c.dead_letters as u64, "dead letter", "dead letters"),
                c.max_task_id,
                c.lsn
            ),
            None if self.tasks.is_none() => {
                outln!("checkpoint      none reads (see below)");
            }
            None if self.dir == self.log_dir => {
                outln!("checkpoint      not looked for (a log directory was given)");
            }
            None => outln!("checkpoint      none: the whole log is replayed"),
        }
        let show = |bytes: Option<u64>| {
            bytes.map_or_else(|| "unreadable".into(), |b| format!("{b} bytes"))
        };
        if !self.checkpoint_files.is_empty() {
            let files: Vec<String> = self
                .checkpoint_files
                .iter()
                .map(|f| format!("{} (LSN {}, {})", file_name(&f.file), f.lsn, show(f.bytes)))
                .collect();
            outln!("  files         {}", files.join(", "));
        }
        if !self.checkpoint_tmp_files.is_empty() {
            let files: Vec<String> = self
                .checkpoint_tmp_files
                .iter()
                .map(|f| format!("{} {}", file_name(&f.file), show(f.bytes)))
                .collect();
            outln!(
                "  leftovers     {} (a checkpoint being written when the engine stopped; the \
                 next open removes them)",
                files.join(", ")
            );
        }
    }

    fn print_log(&self) {
        let bytes: u64 = self.segments.iter().map(|s| s.bytes).sum();
        outln!(
            "segments        {} ({bytes} bytes){}",
            self.segments.len(),
            if self.log_stopped && !self.segments.is_empty() {
                ", those read before the damage"
            } else {
                ""
            }
        );
        let damaged = self.error.as_ref().and_then(|e| e.file.as_ref());
        for s in &self.segments {
            outln!(
                "  {}  {} bytes, {}, LSN {}..{}, {}, live {:.1}%",
                file_name(&s.file),
                s.bytes,
                plural(s.records, "record", "records"),
                s.first_lsn,
                s.last_lsn,
                match s.sealed {
                    Some(true) => "sealed",
                    Some(false) => "active",
                    None if damaged == Some(&s.file) => "damaged",
                    None => "sealed or not: unknown",
                },
                s.live_fraction * 100.0
            );
        }
        if !self.leftover_segments.is_empty() {
            outln!(
                "leftovers       {} segments below the TRIM mark (not read; the next open removes them)",
                self.leftover_segments.len()
            );
        }
        let types: Vec<String> = self
            .record_types
            .iter()
            .map(|t| format!("{} {}", t.type_name, t.count))
            .collect();
        outln!(
            "records         {}{}{}",
            self.records,
            if types.is_empty() {
                String::new()
            } else {
                format!(" ({})", types.join(", "))
            },
            if self.log_stopped {
                ", read before the damage"
            } else {
                ""
            }
        );
        outln!("LSNs            {}..{}", self.first_lsn, self.last_lsn);
        if self.log_stopped {
            return;
        }
        outln!(
            "clean shutdown  {}",
            if self.clean_shutdown == Some(true) {
                "yes"
            } else {
                "no"
            }
        );
        outln!(
            "known durable   up to LSN {} (CLOSED or SYNCED: damage at or below it is corruption)",
            self.durable_lsn.unwrap_or(0)
        );
        match &self.torn_tail {
            None => outln!("torn tail       none"),
            Some(t) => outln!(
                "torn tail       yes: {} bytes at {}:{}, from LSN {} (an unsynced write cut \
                 short; the next open truncates it; not damage)",
                t.bytes_truncated,
                t.file.display(),
                t.offset,
                t.first_lost_lsn
            ),
        }
    }

    fn print_tasks(&self) {
        let Some(t) = &self.tasks else {
            outln!("tasks           unknown: no checkpoint to replay the log on");
            return;
        };
        outln!(
            "tasks           {} live: {} waiting, {} in flight (delivered, unsettled); {}{}",
            t.live,
            t.waiting,
            t.in_flight,
            plural(t.dead_letters as u64, "dead letter", "dead letters"),
            if self.log_stopped {
                format!(" (as of LSN {}, before the damage)", self.last_lsn)
            } else {
                String::new()
            }
        );
        outln!(
            "far             {} of the waiting (beyond the far span: not in memory; key, due time \
             and payload in overflow files)",
            t.far
        );
        outln!(
            "payloads        {} in memory (in the checkpoint or logged after it), {} in overflow \
             files",
            t.payload_in_memory,
            t.payload_in_overflow
        );
    }

    fn print_overflow(&self) {
        let Some(o) = &self.overflow else {
            return;
        };
        let t = &o.total;
        let live = |live: Option<u64>, dead: Option<f64>| match (live, dead) {
            (Some(live), Some(dead)) => format!(", {live} live ({:.1}% dead)", dead * 100.0),
            (Some(live), None) => format!(", {live} live"),
            (None, _) => ", live unknown".to_string(),
        };
        let due = |first: &Option<String>,
                   first_ms: Option<u64>,
                   last: &Option<String>,
                   last_ms: Option<u64>| {
            let show = |text: &Option<String>, ms: Option<u64>| {
                text.clone()
                    .or_else(|| ms.map(|ms| format!("{ms} ms")))
                    .unwrap_or_default()
            };
            if first_ms.is_none() {
                String::new()
            } else {
                format!(", due {}..{}", show(first, first_ms), show(last, last_ms))
            }
        };
        if t.files == 0 {
            outln!("overflow        no files");
        } else {
            outln!(
                "overflow        {}{}, {} bytes: {}{}{}",
                plural(t.files as u64, "file", "files"),
                if t.damaged_files > 0 {
                    format!(" ({} damaged)", t.damaged_files)
                } else {
                    String::new()
                },
                t.bytes,
                plural(t.entries, "entry", "entries")
                    + if t.damaged_files > 0 {
                        " in those that read back"
                    } else {
                        ""
                    },
                live(t.live_entries, t.dead_fraction),
                due(&t.first_due, t.first_due_ms, &t.last_due, t.last_due_ms),
            );
        }
        for f in &o.files {
            let mut line = format!("  {}  ", file_name(&f.file));
            match f.bytes {
                Some(b) => line.push_str(&format!("{b} bytes")),
                None => line.push_str("missing or unreadable"),
            }
            if let Some(n) = f.entries {
                line.push_str(&format!(", {}", plural(n, "entry", "entries")));
                line.push_str(&live(f.live_entries, f.dead_fraction));
                line.push_str(&due(
                    &f.first_due,
                    f.first_due_ms,
                    &f.last_due,
                    f.last_due_ms,
                ));
            }
            if f.orphan == Some(true) {
                line.push_str(
                    "; orphan: no checkpoint in use refers to it (the engine removes it)",
                );
            }
            if let Some(d) = &f.damage {
                line.push_str(&match d.offset {
                    Some(offset) => format!("; DAMAGED at byte offset {offset}: {}", d.message),
                    None => format!("; DAMAGED: {}", d.message),
                });
            }
            outln!("{line}");
        }
        if !o.tmp_files.is_empty() {
            let files: Vec<String> = o
                .tmp_files
                .iter()
                .map(|f| {
                    let bytes = f
                        .bytes
                        .map_or_else(|| "unreadable".into(), |b| format!("{b} bytes"));
                    format!("{} {bytes}", file_name(&f.file))
                })
                .collect();
            outln!(
                "  leftovers     {} (an overflow file being written when the engine stopped; \
                 the next open removes them)",
                files.join(", ")
            );
        }
        outln!(
            "  payload window  unknown here: an engine setting (Config::payload_window), not \
             stored in the directory"
        );
    }

    fn print_disk(&self) {
        let d = &self.disk;
        outln!(
            "disk            {} bytes in {}; log segments {} bytes in {}",
            d.total_bytes,
            plural(d.total_files, "file", "files"),
            d.wal_segment_bytes,
            plural(d.wal_segment_files, "file", "files")
        );
        for part in &d.parts {
            let mut items: Vec<String> = Vec::new();
            if part.segment_files > 0 {
                items.push(plural(part.segment_files, "log segment", "log segments"));
            }
            items.extend(
                part.listed
                    .iter()
                    .map(|f| format!("{} {}", f.path, f.bytes)),
            );
            let unlisted = part
                .files
                .saturating_sub(part.segment_files + part.listed.len() as u64);
            if unlisted > 0 {
                items.push(plural(unlisted, "more file", "more files"));
            }
            outln!(
                "  {:<14}{} bytes in {}{}{}",
                part.name,
                part.bytes,
                plural(part.files, "file", "files"),
                if items.is_empty() { "" } else { ": " },
                items.join(", ")
            );
        }
        for u in &d.unreadable {
            outln!("  unreadable    {u}");
        }
    }

    fn print_verdict(&self) {
        for (i, w) in self.warnings.iter().enumerate() {
            w.print("WARNING");
            if let (Some(c), true) = (&self.checkpoint, self.newer_checkpoint_warning == Some(i)) {
                outln!(
                    "  the engine opens from the older checkpoint {} (the log holds every record \
                     after it), as this summary does",
                    file_name(&c.file)
                );
            }
        }
        if let Some(e) = &self.error {
            e.print("FAILED");
        }
        for f in &self.not_regular_files {
            f.print("FAILED");
        }
        for b in &self.bad_record_details {
            outln!(
                "BAD RECORD: LSN {} ({}) in {}: {}",
                b.lsn,
                b.type_name,
                b.file.display(),
                b.reason
            );
        }
        if self.bad_records > self.bad_record_details.len() as u64 {
            outln!("  … {} bad records in all", self.bad_records);
        }
        if self.ok {
            outln!("OK");
        }
    }
}
