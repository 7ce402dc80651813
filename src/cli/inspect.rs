//! `kairos inspect DIR`: a summary of a data directory — its checkpoint, its
//! log segments, how the last run ended, the pending tasks by state, the bytes
//! each part of the directory uses, and how much of each segment is still
//! needed.
//!
//! Read-only and safe on an untrusted directory: the newest checkpoint that
//! reads back is chosen as the engine's open chooses it (`verify`'s
//! `start_from_checkpoint`; `kairos::checkpoint::read` bounds every length),
//! the log is read through `kairos_wal::scan_located` (lengths checked before
//! anything is allocated, no memory maps), and the records above the
//! checkpoint's LSN are decoded with `Record::decode` and replayed on its state
//! with the engine's own rules (`kairos::replay::Replay`, as `kairos verify`
//! does). Memory: the checkpoint's keys, and one small entry per task live at
//! the point read (the replay's, and the latest schedule's segment and size),
//! not per record.

use super::describe::{file_name, rfc3339, type_name};
use super::verify::{log_dir, start_from_checkpoint, CheckpointStart, Failure, Torn};
use super::Verdict;
use clap::Args;
use kairos::checkpoint as ckpt;
use kairos::record::Record;
use kairos::replay::Replay;
use kairos_wal::format::parse_segment_file_name;
use kairos_wal::{FsStorage, RecordPlace, RecordView, ScanReport, WalError};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Bad records described one by one; the rest are only counted.
const BAD_RECORDS_SHOWN: usize = 10;

/// Files listed by name per part of the directory; the rest are only counted.
const FILES_LISTED: usize = 50;

/// Summarize a data directory, offline and read-only.
#[derive(Debug, Args)]
#[command(long_about = "\
Summarize a data directory, offline and read-only.

DIR is an engine data directory (its log is DIR/wal) or a log directory itself. Prints:

- the checkpoint the engine's open would start from — the newest file in DIR/checkpoint that \
reads back whole: its file, LSN, creation time, size in bytes, and the live tasks and dead \
letters it holds; every checkpoint file present (an older one may be left beside the newest \
after a crash) and leftover *.tmp files. The records above its LSN are replayed on its state; \
those at or below it are only counted (the engine skips them);
- the log's segments: name, size in bytes, records, first and last LSN, sealed or active, and \
their live fraction;
- whether the last shutdown was clean, and a torn tail if there is one (an unsynced write cut \
short by a crash, which the next open truncates: reported, not damage);
- the pending tasks by state, replayed with the engine's own rules: waiting (for their first \
delivery or their next attempt), in flight (delivered, not yet acked, retried, dead-lettered, \
released or cancelled), and dead letters;
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
newest one's damage as a warning. If no checkpoint reads, the log is not read (the task counts \
are unknown).

Exit status 0 when the checkpoint reads, the log holds every record after it, the whole log \
reads and every record above the checkpoint decodes and replays (a torn tail included); 1 if \
a checkpoint or the log is damaged, a record is bad, or the directory cannot be read.")]
pub struct InspectArgs {
    /// Data directory (or its `wal` log directory).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Largest record body accepted, bytes: a longer length field is damage.
    #[arg(long, value_name = "B", default_value_t = kairos_wal::RECORD_BYTES_MAX_DEFAULT)]
    record_bytes_max: u32,
}

/// A part of the summary this version cannot fill in yet. It has no values, so fields
/// of this type are always `None` (`null` in JSON): the change that adds the thing they
/// describe replaces it with a real summary.
#[derive(Debug, Serialize)]
pub(crate) enum NotYetKnown {}

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
    /// Whether the log ends with a clean-close marker (false if the scan failed).
    clean_shutdown: bool,
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
    /// The horizon past which tasks wait in the overflow store. Always `None` for now:
    /// filled in by the change that adds the overflow store.
    horizon: Option<NotYetKnown>,
    /// The overflow store (`DIR/overflow/`). Always `None` for now: filled in by the change
    /// that adds it; until then its files appear only under `disk`, with their sizes.
    overflow: Option<NotYetKnown>,
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
    /// Live tasks it holds.
    tasks: usize,
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
    /// Waiting for their first delivery or their next attempt.
    waiting: usize,
    /// Delivered and not settled (no ACK, RETRY, DEAD, RELEASE or CANCEL yet): the
    /// next open settles them.
    in_flight: usize,
    /// Dead letters kept.
    dead_letters: usize,
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
    let log_dir = log_dir(&args.dir)?;
    let inspection = inspect(&args.dir, log_dir, args.record_bytes_max);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&inspection)?);
    } else {
        inspection.print();
    }
    if let Some(error) = &inspection.error {
        eprintln!("kairos inspect: {}", error.message);
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
    let start = match checkpoint_dir.as_deref() {
        Some(d) => start_from_checkpoint(&FsStorage, d),
        None => Ok(None),
    };
    let mut start = match start {
        Ok(start) => start,
        // The replay has nowhere to start from (the engine would not open): the log is
        // not read.
        Err(failure) => {
            let mut inspection = Reader::new(0, Replay::new(false)).finish(
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
            return inspection;
        }
    };
    let mut reader = match start.as_mut() {
        Some(s) => Reader::new(s.summary.lsn, std::mem::take(&mut s.replay)),
        None => Reader::new(0, Replay::new(false)),
    };
    let scan = kairos_wal::scan_located(&FsStorage, &log_dir, record_bytes_max, &mut |v, p| {
        reader.visit(v, p)
    });
    let after = reader.after;
    let mut inspection = reader.finish(dir, log_dir, scan, disk);
    if let Some(mut s) = start {
        if inspection.error.is_none() {
            if let Err(failure) = s.check_log(inspection.last_lsn, after) {
                inspection.ok = false;
                inspection.error = Some(failure);
            }
        }
        inspection.checkpoint = Some(CheckpointSummary::new(&s));
        inspection.warnings.extend(s.newer_damage);
    }
    inspection.checkpoint_files = checkpoint_files;
    inspection.checkpoint_tmp_files = checkpoint_tmp_files;
    inspection
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
            dead_letters: s.summary.dead_letters,
        }
    }
}

/// What one segment's records add up to, as read.
#[derive(Debug)]
struct Tally {
    file: PathBuf,
    records: u64,
    first_lsn: u64,
    last_lsn: u64,
}

/// Replays the records as the scan hands them over.
struct Reader {
    /// Records at or below this LSN (the checkpoint's) are counted, not replayed.
    covered: u64,
    /// Records read above `covered`.
    after: u64,
    replay: Replay,
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
    /// A reader replaying the records above `covered` on `replay`.
    fn new(covered: u64, replay: Replay) -> Reader {
        Reader {
            covered,
            after: 0,
            replay,
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
        let segment = match self.tallies.last_mut() {
            Some(t) if t.file == place.file => t,
            _ => {
                self.tallies.push(Tally {
                    file: place.file.to_path_buf(),
                    records: 0,
                    first_lsn: lsn,
                    last_lsn: lsn,
                });
                let Some(t) = self.tallies.last_mut() else {
                    return;
                };
                t
            }
        };
        segment.records += 1;
        segment.last_lsn = lsn;
        let index = self.tallies.len() - 1;
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
                self.replay.apply(&record).map_err(|e| e.to_string())?;
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

    fn finish(
        self,
        dir: &Path,
        log_dir: PathBuf,
        scan: Result<ScanReport, WalError>,
        disk: DiskUsage,
    ) -> Inspection {
        let (report, error) = match scan {
            Ok(report) if report.segments.is_empty() => {
                let failure = Failure::no_log(&log_dir);
                (Some(report), Some(failure))
            }
            Ok(report) => (Some(report), None),
            Err(e) => (None, Some(Failure::from(&e))),
        };
        let tasks = TaskCounts {
            live: self.replay.live_tasks(),
            in_flight: self.replay.tasks().filter(|t| t.in_flight).count(),
            waiting: self.replay.tasks().filter(|t| !t.in_flight).count(),
            dead_letters: self.replay.dead_letters(),
        };
        let (live, _) = self.replay.into_parts();
        let mut live_bytes = vec![0u64; self.tallies.len()];
        for (id, (index, bytes)) in &self.latest {
            if live.contains_key(id) {
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
            // whole (ending with SEAL) before it reads the next: every segment but the last
            // one read is sealed.
            None => self
                .tallies
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let bytes = std::fs::metadata(&t.file).map_or(0, |m| m.len());
                    SegmentSummary::new(
                        t.file.clone(),
                        bytes,
                        t.records,
                        (t.first_lsn, t.last_lsn),
                        (i + 1 < self.tallies.len()).then_some(true),
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
        Inspection {
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
            clean_shutdown: report.as_ref().is_some_and(|r| r.clean_shutdown),
            torn_tail: report
                .as_ref()
                .and_then(|r| r.torn_tail.as_ref())
                .map(Torn::from),
            tasks: Some(tasks),
            bad_records: self.bad,
            bad_record_details: self.bad_details,
            disk,
            warnings: Vec::new(),
            checkpoint: None,
            checkpoint_files: Vec::new(),
            checkpoint_tmp_files: Vec::new(),
            horizon: None,
            overflow: None,
        }
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
        println!("data directory  {}", self.dir.display());
        println!("log directory   {}", self.log_dir.display());
        self.print_checkpoint();
        if self.tasks.is_some() {
            self.print_log();
        } else {
            println!("log             not read: replay starts from a checkpoint, and none reads");
        }
        self.print_tasks();
        self.print_disk();
        self.print_verdict();
    }

    fn print_checkpoint(&self) {
        match &self.checkpoint {
            Some(c) => println!(
                "checkpoint      {} at LSN {}, created {}, {} bytes: {}, {} (largest task id \
                 {}); the log is replayed above LSN {}",
                file_name(&c.file),
                c.lsn,
                c.created
                    .clone()
                    .unwrap_or_else(|| format!("at {} ms", c.created_ms)),
                c.bytes,
                count(c.tasks as u64, "live task", "live tasks"),
                count(c.dead_letters as u64, "dead letter", "dead letters"),
                c.max_task_id,
                c.lsn
            ),
            None if self.tasks.is_none() => {
                println!("checkpoint      none reads (see below)");
            }
            None if self.dir == self.log_dir => {
                println!("checkpoint      not looked for (a log directory was given)");
            }
            None => println!("checkpoint      none: the whole log is replayed"),
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
            println!("  files         {}", files.join(", "));
        }
        if !self.checkpoint_tmp_files.is_empty() {
            let files: Vec<String> = self
                .checkpoint_tmp_files
                .iter()
                .map(|f| format!("{} {}", file_name(&f.file), show(f.bytes)))
                .collect();
            println!(
                "  leftovers     {} (a checkpoint being written when the engine stopped; the \
                 next open removes them)",
                files.join(", ")
            );
        }
    }

    fn print_log(&self) {
        let bytes: u64 = self.segments.iter().map(|s| s.bytes).sum();
        println!(
            "segments        {} ({bytes} bytes){}",
            self.segments.len(),
            if self.error.is_some() && !self.segments.is_empty() {
                ", those read before the damage"
            } else {
                ""
            }
        );
        let damaged = self.error.as_ref().and_then(|e| e.file.as_ref());
        for s in &self.segments {
            println!(
                "  {}  {} bytes, {}, LSN {}..{}, {}, live {:.1}%",
                file_name(&s.file),
                s.bytes,
                count(s.records, "record", "records"),
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
            println!(
                "leftovers       {} segments below the TRIM mark (not read; the next open removes them)",
                self.leftover_segments.len()
            );
        }
        let types: Vec<String> = self
            .record_types
            .iter()
            .map(|t| format!("{} {}", t.type_name, t.count))
            .collect();
        println!(
            "records         {}{}{}",
            self.records,
            if types.is_empty() {
                String::new()
            } else {
                format!(" ({})", types.join(", "))
            },
            if self.error.is_some() {
                ", read before the damage"
            } else {
                ""
            }
        );
        println!("LSNs            {}..{}", self.first_lsn, self.last_lsn);
        if self.error.is_some() {
            return;
        }
        println!(
            "clean shutdown  {}",
            if self.clean_shutdown { "yes" } else { "no" }
        );
        match &self.torn_tail {
            None => println!("torn tail       none"),
            Some(t) => println!(
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
            println!("tasks           unknown: no checkpoint to replay the log on");
            return;
        };
        println!(
            "tasks           {} live: {} waiting, {} in flight (delivered, unsettled); {}{}",
            t.live,
            t.waiting,
            t.in_flight,
            count(t.dead_letters as u64, "dead letter", "dead letters"),
            if self.error.is_some() {
                format!(" (as of LSN {}, before the damage)", self.last_lsn)
            } else {
                String::new()
            }
        );
    }

    fn print_disk(&self) {
        let d = &self.disk;
        println!(
            "disk            {} bytes in {}; log segments {} bytes in {}",
            d.total_bytes,
            count(d.total_files, "file", "files"),
            d.wal_segment_bytes,
            count(d.wal_segment_files, "file", "files")
        );
        for part in &d.parts {
            let mut items: Vec<String> = Vec::new();
            if part.segment_files > 0 {
                items.push(count(part.segment_files, "log segment", "log segments"));
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
                items.push(count(unlisted, "more file", "more files"));
            }
            println!(
                "  {:<14}{} bytes in {}{}{}",
                part.name,
                part.bytes,
                count(part.files, "file", "files"),
                if items.is_empty() { "" } else { ": " },
                items.join(", ")
            );
        }
        for u in &d.unreadable {
            println!("  unreadable    {u}");
        }
    }

    fn print_verdict(&self) {
        for w in &self.warnings {
            w.print("WARNING");
            if let Some(c) = &self.checkpoint {
                println!(
                    "  the engine opens from the older checkpoint {} (the log holds every record \
                     after it), as this summary does",
                    file_name(&c.file)
                );
            }
        }
        if let Some(e) = &self.error {
            e.print("FAILED");
        }
        for b in &self.bad_record_details {
            println!(
                "BAD RECORD: LSN {} ({}) in {}: {}",
                b.lsn,
                b.type_name,
                b.file.display(),
                b.reason
            );
        }
        if self.bad_records > self.bad_record_details.len() as u64 {
            println!("  … {} bad records in all", self.bad_records);
        }
        if self.ok {
            println!("OK");
        }
    }
}

/// `1 file`, `2 files`.
fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
