//! `kairos verify DIR`: checks every record of a data directory offline.
//!
//! The directory may be damaged or written by an untrusted party. The log is
//! read through `kairos_wal::scan` (read-only, lengths checked before
//! allocating, no memory maps); every record body is then decoded with
//! `kairos::record::Record::decode` and replayed against the same rules the
//! engine applies when it opens the directory, so a directory that verifies
//! also opens.

// `Record` and `Replay` are `kairos::record::Record` and `kairos::replay::Replay`, named
// through the parent: this file is also compiled into the library (`kairos::fuzzing`), so
// that the fuzz targets and tests run this very checking code; there the parent is a shim.
use super::{ckpt as checkpoint, far, ovf, replay as crate_replay, Record, Replay, Verdict};
use anyhow::{bail, Context as _};
use clap::Args;
use kairos_wal::{FsStorage, RecordView, ScanReport, SegmentInfo, Storage, TornTail, WalError};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Bad records described one by one; the rest are only counted.
const BAD_RECORDS_SHOWN: usize = 10;

/// Check every record of a data directory, offline and read-only.
#[derive(Debug, Args)]
#[command(long_about = "\
Check every record of a data directory, offline and read-only.

DIR is an engine data directory (its log is DIR/wal) or a log directory itself (a data \
directory's wal/ given alone, beside a checkpoint or beside the engine's LOCK file and a \
checkpoint/ directory, is read as its data directory, with the checkpoint and the overflow \
files beside it; a log read alone that was trimmed — its first LSN above 1, the records \
before it held by a checkpoint that is not there — fails as a data directory whose checkpoint is \
missing does). Every segment \
header, record frame and CRC-32 is checked by kairos_wal::scan; every record body is decoded and \
replayed with the rules the engine applies at open (a cancel, delivery or ack must follow its \
task's schedule, ids must increase, a key may be live only once).

With a checkpoint (DIR/checkpoint), replay starts from the newest one that reads, as the \
engine's open does — one whose store id is not the log's (META's), another data directory's \
checkpoint, is damage, as it is to the open —, and every overflow file it refers to (DIR/overflow) is read whole and \
checked: each task's payload entry must be there with the task's id and key, and each far \
task's entry (a task beyond the far span, whose key and payload are only in its overflow entry) \
with the task's id and a key whose hash is the one the checkpoint records. A record naming a \
far task has its key and due time read from that entry. Damage in an entry that no task or \
dead letter live at the end of the log needs (its task cancelled after the checkpoint, or — \
not a far task, whose other records need its entry — acked or given a new payload), or a \
missing file or bad header none of them needs, is a WARNING: the engine opens and never reads \
it. Damage a live task needs fails the check; `kairos salvage` lists those tasks \
and can discard them. The other files in DIR/overflow \
(orphans: the engine removes them) are listed and read too; a damaged orphan is a WARNING, not \
damage, as nothing needs it.

Prints the segments, the record counts, the last LSN, whether the log ended with a clean \
shutdown, and a torn tail if there is one. A torn tail — an unsynced write cut short by a crash, \
which the next open truncates — is reported but is not damage: the exit status stays 0. So is \
a torn mark slot of the newest segment (what a crash while the slot was being written leaves; \
the next open rewrites it as empty), printed as a WARNING with its file and byte offset; a torn \
slot in an older segment, or both slots torn, is damage.

An entry named like a log segment, a checkpoint or an overflow file that is not a regular file \
(a FIFO, a directory, a symbolic link) is reported as a failure: the engine reads regular files \
only and passes over it (never waits on it), so whatever it took the place of is lost to the \
engine. So is a directory or a dangling symbolic link in the place of the data directory's \
LOCK or the log's (wal/LOCK): the engine's open cannot lock it, and fails.

Exit status 0 when every record checks; 1 when something does not (the file and byte offset of \
the damage, or the LSN of a bad record, are printed), an entry named like a Kairos file is not a \
regular file, or the directory cannot be read.")]
pub struct VerifyArgs {
    /// Data directory (or its `wal` log directory).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Largest record body accepted, bytes: a longer length field is damage. At least 23
    /// (the smallest SCHEDULE body).
    #[arg(long, value_name = "B", default_value_t = kairos_wal::RECORD_BYTES_MAX_DEFAULT,
          value_parser = parse_record_bytes_max)]
    record_bytes_max: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The smallest `--record-bytes-max` (of `verify`, `dump` and `inspect`): the smallest SCHEDULE
/// body — its fixed part and a one-byte key (no task has an empty key), no payload. Every task
/// starts with one, so below this every log that scheduled anything reads as damage. (The other
/// records' smallest bodies are smaller: 8 bytes for a cancel or an ack, 16 for a deliver, 18
/// for a retry or a dead, 21 for a reschedule.)
pub(crate) const RECORD_BYTES_MAX_MIN: u32 = super::record::SCHEDULE_FIXED_BYTES as u32 + 1;
// The number `--help` of `verify`, `dump` and `inspect` gives.
const _: () = assert!(RECORD_BYTES_MAX_MIN == 23);

/// `--record-bytes-max`: from [`RECORD_BYTES_MAX_MIN`] to the most a log frame can hold
/// ([`kairos_wal::format::RECORD_BYTES_MAX_LIMIT`]).
pub(crate) fn parse_record_bytes_max(s: &str) -> Result<u32, String> {
    let limit = kairos_wal::format::RECORD_BYTES_MAX_LIMIT;
    match s.parse::<u32>() {
        Ok(n) if (RECORD_BYTES_MAX_MIN..=limit).contains(&n) => Ok(n),
        _ => Err(format!(
            "must be a whole number from {RECORD_BYTES_MAX_MIN} (the smallest SCHEDULE record \
             body: a 1-byte key, no payload) to {limit}"
        )),
    }
}

/// The whole finding, printed as text or JSON.
#[derive(Debug, Serialize)]
pub(crate) struct Verification {
    /// The log directory that was read.
    log_dir: PathBuf,
    /// Whether every record checks.
    ok: bool,
    /// The scan's error, if the log is damaged or unreadable.
    error: Option<Failure>,
    /// Segments, oldest first. If the scan stopped at damage, the segments whose records were
    /// read before it, with the records read (the last one's `sealed` then unknown).
    segments: Vec<Segment>,
    /// Records read (up to the damage, if any).
    records: u64,
    /// Records per type.
    record_types: TypeCounts,
    /// Last LSN of the log; if the scan stopped at damage, of the last record read before it
    /// (0: none).
    last_lsn: u64,
    /// Whether the log ends with a clean-close marker (`None`: unknown, the scan stopped at
    /// damage before the end).
    clean_shutdown: Option<bool>,
    /// An unsynced torn tail that the next open would truncate.
    torn_tail: Option<Torn>,
    /// Tasks live at the end of the log (far tasks included).
    live_tasks: usize,
    /// Of those, far tasks (beyond the far span: key, due time and payload only in their
    /// overflow entry) that no record after the checkpoint touched.
    far_tasks: usize,
    /// Of those, delivered and not acked (in flight at the end of the log).
    live_delivered: usize,
    /// Dead letters kept at the end of the log.
    dead_letters: usize,
    /// The checkpoint replay started from (its LSN and what it holds), if
    /// the data directory has one.
    checkpoint: Option<CheckpointSummary>,
    /// What does not stop the engine from opening but should be looked at: a torn mark slot
    /// of the newest segment (which the open rewrites), a damaged orphan overflow file (which
    /// the open removes), the newest checkpoint file damaged while an older one, which the log
    /// still covers, is used.
    warnings: Vec<Failure>,
    /// Overflow files no checkpoint the engine uses refers to: the next open removes them
    /// (unless the newest checkpoint is damaged: then the next checkpoint does). Each is read
    /// and checked; a damaged one is a warning.
    orphan_overflow_files: Vec<PathBuf>,
    /// Entries named like a log segment, a checkpoint or an overflow file that are not
    /// regular files (a FIFO, a directory, …): the engine passes over them. Each fails the
    /// check.
    not_regular_files: Vec<Failure>,
    /// Records whose body does not decode or does not replay.
    bad_records: u64,
    /// Records above the checkpoint's LSN (all of them without a checkpoint).
    #[serde(skip)]
    records_after_checkpoint: u64,
    /// The first few of them.
    bad_record_details: Vec<BadRecord>,
}

/// The checkpoint the check started from.
#[derive(Debug, Serialize)]
pub(crate) struct CheckpointSummary {
    pub(crate) file: PathBuf,
    pub(crate) lsn: u64,
    /// Live tasks it holds whole (far tasks apart).
    pub(crate) tasks: usize,
    /// Far tasks it holds: id, key hash and overflow entry only.
    pub(crate) far_tasks: usize,
    pub(crate) dead_letters: usize,
}

/// `n` and the noun for it: `one` for 1, `many` otherwise ("0 dead letters", "1 dead letter").
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl CheckpointSummary {
    /// `N live tasks, [F far tasks, ]D dead letters` (far tasks named only if there are any;
    /// each noun singular for 1).
    pub(crate) fn counts(&self) -> String {
        let far = if self.far_tasks > 0 {
            format!(
                "{}, ",
                plural(self.far_tasks as u64, "far task", "far tasks")
            )
        } else {
            String::new()
        };
        format!(
            "{}, {far}{}",
            plural(self.tasks as u64, "live task", "live tasks"),
            plural(self.dead_letters as u64, "dead letter", "dead letters")
        )
    }
}

/// The checkpoint a reading of the log starts from, chosen as the engine's open chooses it
/// (shared by `verify`, `inspect` and `dump`).
#[derive(Debug)]
pub(crate) struct CheckpointStart {
    /// Its file, LSN and counts.
    pub(crate) summary: CheckpointSummary,
    /// Its header's creation time, UTC ms (for humans only).
    pub(crate) created_ms: u64,
    /// Its header's largest task id.
    pub(crate) max_task_id: u64,
    /// Its size in bytes.
    pub(crate) bytes: u64,
    /// Its state (without payloads), on which the records above its LSN are replayed.
    pub(crate) replay: Replay,
    /// If this is not the newest checkpoint file: why the newest one cannot be used. A
    /// warning while the log covers this one; the error otherwise (as at open).
    pub(crate) newer_damage: Option<Failure>,
    /// Its header's store id (the log's).
    pub(crate) store_id: [u8; 16],
    /// The overflow directory next to its checkpoint directory (`None`: it has no parent).
    pub(crate) overflow_dir: Option<PathBuf>,
    /// The payloads it places in overflow files and its far tasks' entries, by file and
    /// offset — filled only by [`start_from_checkpoint_deferring_overflow`], whose caller
    /// checks them as it reads the files ([`check_overflow_entries`]); empty after
    /// [`start_from_checkpoint`], which has checked them.
    pub(crate) overflow_refs: Vec<OverflowRef>,
    /// Overflow files it refers to whose entries do not all read back, or that are missing
    /// (found by [`start_from_checkpoint`]; empty after
    /// [`start_from_checkpoint_deferring_overflow`]): damage only if a task live at the end
    /// of the log needs such an entry ([`DamagedOverflowFile::needed_damage`]).
    pub(crate) damaged_overflow: Vec<DamagedOverflowFile>,
    /// The overflow files it names (a task's payload or a far task's entry), ascending: the
    /// files the engine's open keeps. The others are orphans, which it removes — unless the
    /// newest checkpoint is damaged (`newer_damage`), when it keeps every file.
    pub(crate) named_files: Vec<u32>,
}

/// An overflow entry a checkpoint refers to: a task's payload, or a far task's entry.
#[derive(Debug)]
pub(crate) struct OverflowRef {
    /// The overflow file's number.
    pub(crate) file: u32,
    /// Byte offset of the entry in it.
    pub(crate) offset: u64,
    /// The task whose entry it is.
    pub(crate) task_id: u64,
    /// What the entry's key must be.
    pub(crate) key: EntryKey<Box<[u8]>>,
}

/// What an overflow entry's key must be, as the checkpoint knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKey<K> {
    /// A task's payload: the task's key itself.
    Key(K),
    /// A far task's entry: a key whose hash ([`far::KeyHasher`] under the store id) is this.
    Hash(u64),
}

impl EntryKey<Box<[u8]>> {
    /// The same, borrowed.
    pub(crate) fn as_deref(&self) -> EntryKey<&[u8]> {
        match self {
            EntryKey::Key(k) => EntryKey::Key(k),
            EntryKey::Hash(h) => EntryKey::Hash(*h),
        }
    }
}

/// Reads a far task's key and due time from its overflow entry, for a replay that meets a
/// record needing the task whole ([`Replay::apply_with`]): the entry at the task's place must
/// carry its id and a key whose hash is the checkpoint's. One small read per far task a record
/// names (the engine's open reads the same).
pub(crate) struct FarReader<'a> {
    storage: &'a dyn kairos_wal::Storage,
    overflow_dir: Option<PathBuf>,
    hasher: far::KeyHasher,
}

impl<'a> FarReader<'a> {
    /// The reader for the far tasks of checkpoint `start` (none without one).
    pub(crate) fn new(
        storage: &'a dyn kairos_wal::Storage,
        start: Option<&CheckpointStart>,
    ) -> FarReader<'a> {
        FarReader {
            storage,
            overflow_dir: start.and_then(|s| s.overflow_dir.clone()),
            hasher: far::KeyHasher::new(&start.map_or([0; 16], |s| s.store_id)),
        }
    }

    /// The key and due time of far task `t` (`Err`: why they cannot be read).
    pub(crate) fn read(&self, t: &checkpoint::FarTask) -> Result<(Box<[u8]>, u64), String> {
        self.read_entry(t).map_err(|e| e.message)
    }

    /// As [`FarReader::read`], saying whether the entry was read and found damaged or could
    /// not be read (an I/O error, a missing file).
    pub(crate) fn read_entry(
        &self,
        t: &checkpoint::FarTask,
    ) -> Result<(Box<[u8]>, u64), FarReadError> {
        let Some(dir) = &self.overflow_dir else {
            return Err(FarReadError {
                cause: Cause::Missing,
                message: "there is no overflow directory to read its entry from".into(),
            });
        };
        let path = dir.join(ovf::file_name(t.file));
        let e = ovf::read_entry(self.storage, &path, t.offset, t.id, None).map_err(|e| {
            FarReadError {
                cause: match &e {
                    ovf::OverflowReadError::Io { source, .. } => Cause::of_io(source),
                    _ => Cause::Damage,
                },
                message: e.to_string(),
            }
        })?;
        let hash = self.hasher.hash(&e.key);
        if hash != t.key_hash {
            return Err(FarReadError {
                cause: Cause::Damage,
                message: format!(
                    "the key of its entry in {} hashes to {hash:016x}, the checkpoint says \
                     {:016x}",
                    path.display(),
                    t.key_hash
                ),
            });
        }
        Ok((e.key, e.due_ms))
    }
}

/// Why [`FarReader::read_entry`] could not read a far task's key and due time.
#[derive(Debug)]
pub(crate) struct FarReadError {
    /// Whether the entry's bytes were read and are wrong ([`Cause::Damage`]: not the task's
    /// entry, or a key with another hash), or could not be read: an I/O error
    /// ([`Cause::Unreadable`]), or the file or overflow directory is not there
    /// ([`Cause::Missing`]).
    pub(crate) cause: Cause,
    /// What was found, with the I/O error if any.
    pub(crate) message: String,
}

/// Where and why the scan stopped (also used by `dump` and `inspect`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Failure {
    /// The damaged or unreadable file, if the error names one.
    pub(crate) file: Option<PathBuf>,
    /// Byte offset of the damage in `file`, if the error names one.
    pub(crate) offset: Option<u64>,
    /// The error.
    pub(crate) message: String,
    /// Whether the file could not be read at all (an I/O error: permission denied, not a
    /// regular file, gone), rather than read and found damaged — `dump` says which.
    #[serde(skip)]
    pub(crate) cause: Cause,
}

/// Why a [`Failure`]'s file failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Its bytes were read and are wrong (or the directory's files do not fit together).
    #[default]
    Damage,
    /// It could not be read: the I/O error is in the message.
    Unreadable,
    /// It is not there.
    Missing,
}

impl Cause {
    /// The cause of an I/O error.
    pub(crate) fn of_io(e: &std::io::Error) -> Cause {
        if e.kind() == std::io::ErrorKind::NotFound {
            Cause::Missing
        } else {
            Cause::Unreadable
        }
    }

    /// `damaged`, `unreadable` or `missing`, to put before what the file is.
    pub(crate) fn adjective(self) -> &'static str {
        match self {
            Cause::Damage => "damaged",
            Cause::Unreadable => "unreadable",
            Cause::Missing => "missing",
        }
    }
}

#[derive(Debug, Serialize)]
struct Segment {
    file: PathBuf,
    bytes: u64,
    records: u64,
    first_lsn: u64,
    last_lsn: u64,
    /// `None`: unknown (the segment the scan stopped in).
    sealed: Option<bool>,
}

/// What one segment's records add up to, as read (also used by `inspect`).
#[derive(Debug)]
pub(crate) struct Tally {
    pub(crate) file: PathBuf,
    pub(crate) records: u64,
    pub(crate) first_lsn: u64,
    pub(crate) last_lsn: u64,
}

impl Tally {
    /// Counts the record at `lsn`, read from `file`, into `tallies` (a new tally when the
    /// scan moved on to another segment); returns the index of that segment's tally.
    pub(crate) fn count(tallies: &mut Vec<Tally>, file: &Path, lsn: u64) -> usize {
        match tallies.last_mut() {
            Some(t) if t.file == file => {
                t.records += 1;
                t.last_lsn = lsn;
            }
            _ => tallies.push(Tally {
                file: file.to_path_buf(),
                records: 1,
                first_lsn: lsn,
                last_lsn: lsn,
            }),
        }
        tallies.len() - 1
    }
}

/// An unsynced torn tail (also used by `dump` and `inspect`).
#[derive(Debug, Serialize)]
pub(crate) struct Torn {
    pub(crate) file: PathBuf,
    pub(crate) offset: u64,
    pub(crate) bytes_truncated: u64,
    pub(crate) first_lost_lsn: u64,
}

#[derive(Debug, Default, Serialize)]
struct TypeCounts {
    schedule: u64,
    cancel: u64,
    deliver: u64,
    ack: u64,
    retry: u64,
    dead: u64,
    purge: u64,
    reschedule: u64,
    release: u64,
}

#[derive(Debug, Clone, Serialize)]
struct BadRecord {
    lsn: u64,
    /// The segment holding it.
    file: PathBuf,
    /// Byte offset of the record (its record header) in `file`.
    offset: u64,
    reason: String,
}

/// Runs the check and prints the finding.
pub fn run(args: &VerifyArgs) -> anyhow::Result<Verdict> {
    let (data_dir, log_dir) = dirs(&args.dir, "verify")?;
    let checkpoint_dir =
        (log_dir != data_dir).then(|| data_dir.join(checkpoint::CHECKPOINT_DIR_NAME));
    let mut v = check(&FsStorage, log_dir, checkpoint_dir, args.record_bytes_max);
    v.not_regular_files = not_regular_files(&data_dir, &v.log_dir);
    v.ok &= v.not_regular_files.is_empty();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        v.print();
    }
    if let Some(error) = &v.error {
        errln!("kairos verify: {}", error.message);
    }
    for f in &v.not_regular_files {
        errln!("kairos verify: {}", f.message);
    }
    Ok(if v.ok { Verdict::Pass } else { Verdict::Fail })
}

/// Checks the log directory `log_dir` of `storage` (the real file system here; a simulated
/// one in the fuzz targets and tests): scan, decode and replay every record — starting from the
/// newest checkpoint in `checkpoint_dir` if there is one, as the engine's open does (then only
/// records above its LSN are replayed, and the log must hold every one of them).
pub(crate) fn check(
    storage: &dyn Storage,
    log_dir: PathBuf,
    checkpoint_dir: Option<PathBuf>,
    record_bytes_max: u32,
) -> Verification {
    let mut census = Census::default();
    let mut start = None;
    if let Some(dir) = &checkpoint_dir {
        match start_from_checkpoint(storage, dir, &log_dir) {
            Ok(None) => {}
            Ok(Some(mut s)) => {
                census.covered = s.summary.lsn;
                census.replay = std::mem::take(&mut s.replay);
                start = Some(s);
            }
            Err(failure) => {
                let mut v = Verification::new(storage, log_dir, Ok(ScanReport::default()), census);
                v.segments.clear();
                v.ok = false;
                v.error = Some(failure);
                return v;
            }
        }
    }
    let far_reader = FarReader::new(storage, start.as_ref());
    let scan = kairos_wal::scan_located(storage, &log_dir, record_bytes_max, &mut |view, at| {
        census.visit(view, at.file, at.offset, &far_reader)
    });
    // Damaged overflow entries are damage only if the tasks live at the end of the log need
    // them; a log that does not read to its end cannot tell, so then they are.
    let mut overflow_damage = Vec::new();
    if let Some(s) = &start {
        if !s.damaged_overflow.is_empty() {
            let read_whole = census.bad == 0 && scan.as_ref().is_ok_and(|r| !r.segments.is_empty());
            let files: Vec<u32> = s.damaged_overflow.iter().map(|d| d.file).collect();
            let needed = needed_entries(&census.replay, &files);
            let hasher = far::KeyHasher::new(&s.store_id);
            for d in &s.damaged_overflow {
                overflow_damage.push(if read_whole {
                    d.judge(storage, &needed, &hasher)
                } else {
                    Err(d.damage.clone())
                });
            }
        }
    }
    // A far task a record after the checkpoint needed whole, its entry unread, still live at
    // the end: the engine's open refuses the directory (the overflow judgement above names
    // the entry when its file is among the damaged ones; this covers an entry that could not
    // be read for another reason).
    let unresolved = census.replay.unresolved_at_end().err().map(|held| Failure {
        file: start
            .as_ref()
            .and_then(|s| s.overflow_dir.as_ref())
            .map(|d| d.join(ovf::file_name(held.task.file))),
        offset: Some(held.task.offset),
        message: held.to_string(),
        cause: Cause::Damage,
    });
    let mut v = Verification::new(storage, log_dir, scan, census);
    // Damage in the log is the error reported when there is some: the engine's open refuses
    // the log before it reads any overflow entry, and without the whole log no overflow damage
    // can be judged — it is then shown as a warning saying so (the check fails either way).
    // Otherwise the first overflow file's damage is the error.
    let log_error = v.error.is_some();
    let mut first_failure = true;
    for judged in overflow_damage {
        match judged {
            Ok(warning) => v.warnings.push(warning),
            Err(failure) if log_error => {
                v.ok = false;
                v.warnings.push(Failure {
                    message: format!(
                        "{} (not judged: the log does not read to its end, so which tasks \
                         need it is not known)",
                        failure.message
                    ),
                    ..failure
                });
            }
            Err(failure) => {
                v.ok = false;
                if std::mem::take(&mut first_failure) {
                    v.error = Some(failure);
                }
            }
        }
    }
    if let Some(failure) = unresolved.filter(|_| v.ok) {
        v.ok = false;
        v.error = Some(failure);
    }
    if let Some(ovf_dir) = checkpoint_dir
        .as_deref()
        .and_then(Path::parent)
        .map(|d| d.join(ovf::OVERFLOW_DIR_NAME))
    {
        let (orphans, warnings) = check_orphan_overflow_files(storage, &ovf_dir, start.as_ref());
        v.orphan_overflow_files = orphans;
        v.warnings.extend(warnings);
    }
    if let Some(mut s) = start {
        if v.error.is_none() {
            if let Err(failure) = s.check_log(v.last_lsn, v.records_after_checkpoint) {
                v.ok = false;
                v.error = Some(failure);
            }
        }
        v.warnings.extend(s.newer_damage);
        v.checkpoint = Some(s.summary);
    } else if v.error.is_none() {
        let first = v.segments.first().map(|s| (s.file.as_path(), s.first_lsn));
        if let Some(failure) = missing_checkpoint(first, checkpoint_dir.is_none()) {
            v.ok = false;
            v.error = Some(failure);
        }
    }
    v
}

/// For a data directory with no checkpoint, or a log directory read `alone` (without its data
/// directory, so without a checkpoint), whose log's first segment is `first` (file, first
/// LSN): the failure if the log was trimmed — the records before its start went with a
/// checkpoint that is missing here, and the engine refuses to open (`verify`, `inspect` and
/// `dump` report it alike). Only a checkpoint trims a Kairos log.
pub(crate) fn missing_checkpoint(first: Option<(&Path, u64)>, alone: bool) -> Option<Failure> {
    let (file, first_lsn) = first.filter(|&(_, lsn)| lsn > 1)?;
    let message = if alone {
        format!(
            "the log starts at LSN {first_lsn}: it was trimmed after a checkpoint, which holds \
             the effect of the records before it, and a log directory read alone has no \
             checkpoint (records about the tasks it holds look orphaned): read the data \
             directory it came from, with its checkpoint/ and overflow/"
        )
    } else {
        format!(
            "there is no checkpoint, but the log starts at LSN {first_lsn}: the checkpoint that \
             covers the records before it is missing"
        )
    };
    Some(Failure {
        cause: Cause::Damage,
        file: Some(file.to_path_buf()),
        offset: None,
        message,
    })
}

/// The newest checkpoint in `dir` (a data directory's `checkpoint/`) that reads back whole,
/// as a replay to continue from — the one the engine's open would start from. If the newest
/// file does not read and an older one does, the older one is returned with the newest
/// one's damage (`newer_damage`); [`CheckpointStart::check_log`] then decides, as the open
/// does, whether that damage is only a warning. `Ok(None)` if there is no checkpoint file;
/// `Err` names the newest file's damage (file and byte offset) when none reads. Every overflow
/// file the checkpoint places a payload in is read and checked (`check_overflow_refs`): a
/// damaged one is the error. So is every overflow file holding a far task's entry: the entry
/// must be there, with the task's id and a key whose hash is the checkpoint's.
pub(crate) fn start_from_checkpoint(
    storage: &dyn Storage,
    dir: &Path,
    log_dir: &Path,
) -> Result<Option<CheckpointStart>, Failure> {
    start_from(storage, dir, log_dir, false)
}

/// As [`start_from_checkpoint`], but the overflow files are not read: the payloads the
/// checkpoint places in them are returned in [`CheckpointStart::overflow_refs`], for a caller
/// that reads every overflow file anyway (`inspect`) to check with
/// [`check_overflow_entries`] — so that each file is read once, and a damaged one does not
/// stop the reading of the log.
pub(crate) fn start_from_checkpoint_deferring_overflow(
    storage: &dyn Storage,
    dir: &Path,
    log_dir: &Path,
) -> Result<Option<CheckpointStart>, Failure> {
    start_from(storage, dir, log_dir, true)
}

/// The byte offset of the store id in a checkpoint's header (`wal/FORMAT.md`, "Checkpoint
/// files").
const CHECKPOINT_STORE_ID_OFFSET: u64 = 16;

/// `start_from_checkpoint`'s body; the checkpoint must belong to the log in `log_dir` (its
/// store id, the one in the log's `META`), as the engine's open requires before it replays
/// anything — a checkpoint of another data directory is refused, naming the checkpoint (its
/// overflow files would otherwise look foreign instead).
fn start_from(
    storage: &dyn Storage,
    dir: &Path,
    log_dir: &Path,
    defer_overflow: bool,
) -> Result<Option<CheckpointStart>, Failure> {
    // `None` if the log's META is missing, cannot be read or does not decode: the scan of the
    // log reports that.
    let log_store_id = kairos_wal::read_store_id(storage, log_dir).ok().flatten();
    let (files, _) = checkpoint::list(storage, dir).map_err(|e| Failure {
        cause: Cause::of_io(&e),
        file: Some(dir.to_path_buf()),
        offset: None,
        message: format!("cannot list {}: {e}", dir.display()),
    })?;
    let mut newest_error = None;
    for (lsn, name) in files.iter().rev() {
        let path = dir.join(name);
        let read = checkpoint::read(storage, &path).map_err(|e| {
            let offset = match &e {
                checkpoint::CheckpointReadError::Corrupt { offset, .. } => Some(*offset),
                // The version is the header's (byte 8 of it); the header is at 0.
                checkpoint::CheckpointReadError::UnsupportedVersion { .. } => Some(0),
                _ => None,
            };
            let cause = match &e {
                checkpoint::CheckpointReadError::Io { source, .. } => Cause::of_io(source),
                _ => Cause::Damage,
            };
            Failure {
                cause,
                file: Some(path.clone()),
                offset,
                message: e.to_string(),
            }
        });
        let c = match read {
            Ok(c) => c,
            // A read that failed (an I/O error) says nothing about the file: the engine's
            // open fails rather than fall back to an older checkpoint, and so does the check.
            Err(f) if f.cause != Cause::Damage => return Err(f),
            Err(f) => {
                newest_error.get_or_insert(f);
                continue;
            }
        };
        let Some(header) = c.header.filter(|h| h.lsn == *lsn) else {
            newest_error.get_or_insert(Failure {
                cause: Cause::Damage,
                file: Some(path.clone()),
                offset: Some(0),
                message: format!(
                    "checkpoint {} holds another LSN than its name",
                    path.display()
                ),
            });
            continue;
        };
        if log_store_id.is_some_and(|id| id != header.store_id) {
            return Err(Failure {
                cause: Cause::Damage,
                file: Some(path.clone()),
                offset: Some(CHECKPOINT_STORE_ID_OFFSET),
                message: format!(
                    "checkpoint {} belongs to another data directory: its store id is not the \
                     one in the log's META ({}), so the engine's open refuses it",
                    path.display(),
                    log_dir.join(kairos_wal::format::META_FILE_NAME).display()
                ),
            });
        }
        let (tasks, far_tasks, dead_letters) = (c.tasks.len(), c.far.len(), c.dead.len());
        let mut named_files: Vec<u32> = c
            .tasks
            .iter()
            .filter_map(|(_, t)| t.payload_at.map(|(file, _)| file))
            .chain(c.far.iter().map(|t| t.file))
            .collect();
        named_files.sort_unstable();
        named_files.dedup();
        let mut overflow_refs = Vec::new();
        let mut damaged_overflow = Vec::new();
        if defer_overflow {
            overflow_refs = c
                .tasks
                .iter()
                .filter_map(|(id, t)| {
                    let (file, offset) = t.payload_at?;
                    Some(OverflowRef {
                        file,
                        offset,
                        task_id: *id,
                        key: EntryKey::Key(t.key.as_bytes().into()),
                    })
                })
                .chain(c.far.iter().map(|t| OverflowRef {
                    file: t.file,
                    offset: t.offset,
                    task_id: t.id,
                    key: EntryKey::Hash(t.key_hash),
                }))
                .collect();
            overflow_refs.sort_unstable_by_key(|r| (r.file, r.offset));
        } else {
            damaged_overflow =
                check_overflow_refs(storage, dir, &header.store_id, &c.tasks, &c.far)?;
        }
        let not_replayable = |e: crate_replay::RuleError| Failure {
            cause: Cause::Damage,
            file: Some(path.clone()),
            offset: None,
            message: format!("checkpoint {}: {e}", path.display()),
        };
        let mut replay = Replay::from_checkpoint(header.max_task_id, c.tasks, c.dead, false)
            .map_err(not_replayable)?;
        replay.add_far(c.far).map_err(not_replayable)?;
        // Distinct ids and keys checked now, even with no record after the
        // checkpoint (the replay builds its tables lazily; the engine's open
        // checks keys in its own index).
        replay.build_tables().map_err(not_replayable)?;
        let bytes = storage
            .open(&path, kairos_wal::storage::OpenMode::Read)
            .and_then(|f| f.len())
            .unwrap_or(0);
        return Ok(Some(CheckpointStart {
            summary: CheckpointSummary {
                file: path,
                lsn: header.lsn,
                tasks,
                far_tasks,
                dead_letters,
            },
            created_ms: header.created_ms,
            max_task_id: header.max_task_id,
            bytes,
            replay,
            newer_damage: newest_error,
            store_id: header.store_id,
            overflow_dir: dir.parent().map(|d| d.join(ovf::OVERFLOW_DIR_NAME)),
            overflow_refs,
            damaged_overflow,
            named_files,
        }));
    }
    newest_error.map_or(Ok(None), Err)
}

/// Every payload the checkpoint says is in an overflow file (next to `checkpoint_dir`, in
/// `overflow/`), and every far task's entry, must be there: the file exists, reads back whole
/// (header, every entry's CRC, store id, number) and holds that task's entry at that offset —
/// with the task's key, or for a far task a key whose hash is the checkpoint's. Each file is
/// read once, sequentially.
fn check_overflow_refs(
    storage: &dyn Storage,
    checkpoint_dir: &Path,
    store_id: &[u8; 16],
    tasks: &[(u64, crate_replay::LiveTask)],
    far_tasks: &[checkpoint::FarTask],
) -> Result<Vec<DamagedOverflowFile>, Failure> {
    // File → (offset, task id, key) of each entry the checkpoint puts there.
    type Refs<'a> = std::collections::BTreeMap<u32, Vec<(u64, u64, EntryKey<&'a [u8]>)>>;
    let mut by_file: Refs<'_> = std::collections::BTreeMap::new();
    for (id, t) in tasks {
        if let Some((file, offset)) = t.payload_at {
            by_file
                .entry(file)
                .or_default()
                .push((offset, *id, EntryKey::Key(&t.key)));
        }
    }
    for t in far_tasks {
        by_file
            .entry(t.file)
            .or_default()
            .push((t.offset, t.id, EntryKey::Hash(t.key_hash)));
    }
    let hasher = far::KeyHasher::new(store_id);
    let Some(data_dir) = checkpoint_dir.parent() else {
        return Ok(Vec::new());
    };
    let ovf_dir = data_dir.join(ovf::OVERFLOW_DIR_NAME);
    let mut damaged = Vec::new();
    for (file, refs) in by_file {
        let path = ovf_dir.join(ovf::file_name(file));
        let damage = match ovf::read_file(storage, &path, Some(store_id), Some(file)) {
            Ok(entries) => {
                check_overflow_entries(&path, &entries, refs, Some(&hasher))?;
                continue;
            }
            Err(e) => Failure::overflow(&path, &e),
        };
        // Damage, or a missing file: whether a task needs what it costs is known only at the
        // end of the log. An I/O error says nothing about the file.
        if damage.cause == Cause::Unreadable {
            return Err(damage);
        }
        let missing = damage.cause == Cause::Missing;
        damaged.push(DamagedOverflowFile {
            file,
            path,
            missing,
            damage,
            refs: refs
                .into_iter()
                .map(|(offset, id, key)| {
                    let key = match key {
                        EntryKey::Key(k) => EntryKey::Key(Box::from(k)),
                        EntryKey::Hash(h) => EntryKey::Hash(h),
                    };
                    (offset, id, key)
                })
                .collect(),
        });
    }
    Ok(damaged)
}

/// The failure for overflow entries tasks need that do not read back (`lost`, not empty):
/// the first one's file, offset and reason, and how many there are.
pub(crate) fn needed_damage_failure(lost: &[DamagedEntry]) -> Failure {
    let first = &lost[0];
    let more = match lost.len() {
        1 => String::new(),
        n => format!(" ({} more damaged entries that tasks need in it)", n - 1),
    };
    Failure {
        cause: Cause::Damage,
        file: Some(first.file.clone()),
        offset: first.damage_offset,
        message: format!(
            "{}: it holds {} {}'s {}{more}; `kairos salvage` lists the tasks whose entries are \
             damaged and can discard them",
            first.reason,
            first.used_as.noun(),
            first.task_id,
            match first.used_as {
                EntryUse::FarTask => "entry",
                _ => "payload",
            },
        ),
    }
}

/// An overflow file a checkpoint refers to that does not read back whole (or is missing),
/// found before the log is read: whether that is damage depends on the log — an entry no
/// task needs at the end of it (its task cancelled after the checkpoint, or, not a far task,
/// acked or given a new payload) is read by nothing: the engine's open reads the header of
/// a file a task needs and checks that the entry at the largest offset one refers to lies
/// within it, counts a file no task needs empty if its header does not read, and its
/// promotion of far tasks goes past an entry no far task needs. See
/// [`DamagedOverflowFile::judge`].
#[derive(Debug)]
pub(crate) struct DamagedOverflowFile {
    /// The overflow file's number.
    pub(crate) file: u32,
    /// Its path.
    pub(crate) path: PathBuf,
    /// Whether it is missing (otherwise it is there, and its header or an entry does not
    /// read back).
    pub(crate) missing: bool,
    /// The first damage in it, as a whole-file read found it (file and offset).
    pub(crate) damage: Failure,
    /// The entries the checkpoint places in it: `(offset, task id, key)`.
    pub(crate) refs: Vec<EntryRef>,
}

/// An entry a checkpoint places in an overflow file: `(offset, task id, key)`.
pub(crate) type EntryRef = (u64, u64, EntryKey<Box<[u8]>>);

/// What a live task or dead letter uses an overflow entry for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EntryUse {
    /// A far task's whole entry: its key, due time and payload.
    FarTask,
    /// A waiting or in-flight task's payload.
    Payload,
    /// A dead letter's payload.
    DeadLetter,
}

impl EntryUse {
    /// For messages.
    pub(crate) fn noun(self) -> &'static str {
        match self {
            EntryUse::FarTask => "far task",
            EntryUse::Payload => "task",
            EntryUse::DeadLetter => "dead letter",
        }
    }
}

/// Overflow entries tasks need: `(file, offset)` → (task id, what for).
pub(crate) type NeededEntries = std::collections::HashMap<(u32, u64), (u64, EntryUse)>;

/// The overflow entries the tasks and dead letters live at the end of a replay need, in
/// given files.
pub(crate) fn needed_entries(replay: &Replay, files: &[u32]) -> NeededEntries {
    let wanted = |f: u32| files.contains(&f);
    let mut needed = std::collections::HashMap::new();
    for t in replay.far().filter(|t| wanted(t.file)) {
        needed.insert((t.file, t.offset), (t.id, EntryUse::FarTask));
    }
    for (id, t) in replay.tasks_with_ids() {
        if let Some((f, offset)) = t.payload_at.filter(|(f, _)| wanted(*f)) {
            needed.insert((f, offset), (id, EntryUse::Payload));
        }
    }
    for (&id, &(f, offset)) in replay.dead_payloads_on_disk().iter() {
        if wanted(f) {
            needed.insert((f, offset), (id, EntryUse::DeadLetter));
        }
    }
    // A far task whose entry a record after the checkpoint could not read, still live: its
    // key is only in that entry (a new payload given since does not change that).
    for u in replay.unresolved_live().filter(|u| wanted(u.file)) {
        if !replay.is_dead_letter(u.id) {
            needed.insert((u.file, u.offset), (u.id, EntryUse::FarTask));
        }
    }
    needed
}

/// An overflow entry a live task or dead letter needs that does not read back.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DamagedEntry {
    /// The task (or dead letter) it belongs to.
    pub(crate) task_id: u64,
    /// What the task uses it for.
    pub(crate) used_as: EntryUse,
    /// The task's key, when known outside the entry (a far task's is only in it).
    #[serde(skip)]
    pub(crate) key: Option<Box<[u8]>>,
    /// The overflow file.
    pub(crate) file: PathBuf,
    /// The entry's byte offset in it.
    pub(crate) offset: u64,
    /// What is wrong.
    pub(crate) reason: String,
    /// Where the damage is: the entry's offset, or for a file the engine cannot use at all
    /// its header's damage (`Some(0)`…) or `None` (missing).
    #[serde(skip)]
    pub(crate) damage_offset: Option<u64>,
}

impl DamagedOverflowFile {
    /// The entries of this file that a task or dead letter live at the end of the log needs
    /// (`needed`, from [`needed_entries`]) and that do not read back as the engine reads
    /// them one at a time (its id, its key — a far task's: the checkpoint's key hash — and
    /// its CRC), or all of them if the engine cannot use the file ([`Self::whole_file`]).
    ///
    /// # Errors
    /// A needed entry could not be read (an I/O error: nothing is known about it).
    pub(crate) fn needed_damage(
        &self,
        storage: &dyn Storage,
        needed: &NeededEntries,
        hasher: &far::KeyHasher,
    ) -> Result<Vec<DamagedEntry>, Failure> {
        let mut out = Vec::new();
        let mut file = None;
        for (offset, id, key) in &self.refs {
            let Some(&(task_id, used_as)) = needed.get(&(self.file, *offset)) else {
                continue;
            };
            if task_id != *id {
                continue;
            }
            let known_key = match key {
                EntryKey::Key(k) => Some(k.clone()),
                EntryKey::Hash(_) => None,
            };
            let damaged = |reason: String| DamagedEntry {
                task_id,
                used_as,
                key: known_key.clone(),
                file: self.path.clone(),
                offset: *offset,
                reason,
                damage_offset: if self.whole_file() {
                    self.damage.offset
                } else {
                    Some(*offset)
                },
            };
            if self.missing {
                out.push(damaged(format!(
                    "overflow file {} is missing",
                    self.path.display()
                )));
                continue;
            }
            if self.whole_file() {
                out.push(damaged(format!(
                    "{} (the file's header: the engine's open refuses a file a task needs \
                     whose header does not read)",
                    self.damage.message
                )));
                continue;
            }
            if file.is_none() {
                file = Some(
                    ovf::EntryFile::open(storage, &self.path)
                        .map_err(|e| Failure::overflow(&self.path, &e))?,
                );
            }
            let Some(reader) = &file else { continue };
            let want_key = match key {
                EntryKey::Key(k) => Some(&k[..]),
                EntryKey::Hash(_) => None,
            };
            match reader.read(*offset, *id, want_key) {
                Ok(entry) => {
                    if let EntryKey::Hash(want) = key {
                        let got = hasher.hash(&entry.key);
                        if got != *want {
                            out.push(damaged(format!(
                                "overflow file {}: the entry of far task {id} at byte offset \
                                 {offset} has a key whose hash is {got:016x}, the checkpoint \
                                 says {want:016x}",
                                self.path.display()
                            )));
                        }
                    }
                }
                Err(e @ ovf::OverflowReadError::Corrupt { .. }) => out.push(damaged(e.to_string())),
                Err(e) => return Err(Failure::overflow(&self.path, &e)),
            }
        }
        if !self.whole_file() {
            self.far_entries_not_promotable(storage, needed, &mut out)?;
        }
        Ok(out)
    }

    /// Adds to `out` the far tasks `needed` whose entries in this file each read back but
    /// which the promotion of far tasks cannot promote ([`ovf::walk_far_entries`]): out of
    /// (due time, task id) order — it poisons the engine when it reads there (an entry out
    /// of order that no far task needs, it goes past) — or at an offset its entry-after-entry
    /// reading never reaches. Entries already in `out` are not added again.
    fn far_entries_not_promotable(
        &self,
        storage: &dyn Storage,
        needed: &NeededEntries,
        out: &mut Vec<DamagedEntry>,
    ) -> Result<(), Failure> {
        // Offset → task id of each far task's entry in this file.
        let far: std::collections::BTreeMap<u64, u64> = self
            .refs
            .iter()
            .filter_map(|(offset, id, _)| match needed.get(&(self.file, *offset)) {
                Some(&(task_id, EntryUse::FarTask)) if task_id == *id => Some((*offset, *id)),
                _ => None,
            })
            .collect();
        if far.is_empty() {
            return Ok(());
        }
        let offsets: Vec<u64> = far.keys().copied().collect();
        let walk = ovf::walk_far_entries(storage, &self.path, &offsets)
            .map_err(|e| Failure::overflow(&self.path, &e))?;
        let out_of_order = walk.out_of_order.into_iter().map(|offset| {
            (
                offset,
                "is out of (due time, task id) order (an entry before it in the file comes after \
                 it in that order): the promotion of far tasks cannot place it, and poisons the \
                 engine when it reads there",
            )
        });
        let unreached = walk.unreached.into_iter().map(|offset| {
            (
                offset,
                "does not begin where an entry of the file does (it lies inside another \
                 entry): the promotion of far tasks, which reads the file entry after entry, \
                 never finds it, and poisons the engine at the file's end",
            )
        });
        for (offset, what) in out_of_order.chain(unreached) {
            if out.iter().any(|d| d.offset == offset) {
                continue;
            }
            let task_id = far[&offset];
            out.push(DamagedEntry {
                task_id,
                used_as: EntryUse::FarTask,
                key: None,
                file: self.path.clone(),
                offset,
                reason: format!(
                    "overflow file {}: the entry of far task {task_id} at byte offset {offset} \
                     {what}",
                    self.path.display()
                ),
                damage_offset: Some(offset),
            });
        }
        Ok(())
    }

    /// A file found damaged (or missing) by a whole read, after the log was read to its
    /// end (`needed`: [`needed_entries`] of that replay): `Ok(warning)` if no task or dead
    /// letter live then needs what is damaged, `Err(failure)` otherwise — the first needed
    /// entry that does not read back ([`needed_damage_failure`]; every needed entry when the
    /// header does not read, as the engine's open then refuses the file), or an I/O error.
    /// A file no task needs is not read by the engine's open beyond its header, and a bad
    /// header there only makes the open count it empty (the next checkpoint deletes it).
    pub(crate) fn judge(
        &self,
        storage: &dyn Storage,
        needed: &NeededEntries,
        hasher: &far::KeyHasher,
    ) -> Result<Failure, Failure> {
        if self.damage.cause == Cause::Unreadable {
            return Err(self.damage.clone());
        }
        match self.needed_damage(storage, needed, hasher)? {
            lost if lost.is_empty() => Ok(self.unneeded_warning()),
            lost => Err(needed_damage_failure(&lost)),
        }
    }

    /// Whether the engine cannot use the file at all — missing, or its header does not read
    /// (bad bytes, another directory's, another number): every entry a task needs in it is
    /// lost.
    pub(crate) fn whole_file(&self) -> bool {
        self.missing
            || (self.damage.cause == Cause::Damage
                && self
                    .damage
                    .offset
                    .is_none_or(|o| o < ovf::HEADER_BYTES as u64))
    }

    /// The warning for damage no live task needs.
    pub(crate) fn unneeded_warning(&self) -> Failure {
        let what = if self.missing {
            format!("overflow file {} is missing", self.path.display())
        } else {
            self.damage.message.clone()
        };
        Failure {
            message: format!(
                "{what}, but no task or dead letter live at the end of the log needs what is \
                 lost (their tasks finished after the checkpoint): the engine opens and reads \
                 past it; the file goes once a checkpoint no longer names it"
            ),
            ..self.damage.clone()
        }
    }
}

/// Checks the overflow entries a checkpoint started with
/// [`start_from_checkpoint_deferring_overflow`] refers to (`refs`, taken out of `start`,
/// sorted by file and offset), after the log was read, as [`start_from_checkpoint`] and
/// [`check`] do: every file, damage in entries no task or dead letter
/// live at the end of `replay` needs being a warning ([`DamagedOverflowFile::judge`]) —
/// without a `replay` (the log did not read to its end), any damage fails. Returns the
/// first failure and the warnings.
pub(crate) fn check_overflow_refs_after_log(
    storage: &dyn Storage,
    start: &CheckpointStart,
    refs: &[OverflowRef],
    replay: Option<&Replay>,
) -> (Option<Failure>, Vec<Failure>) {
    let Some(ovf_dir) = &start.overflow_dir else {
        return (None, Vec::new());
    };
    let hasher = far::KeyHasher::new(&start.store_id);
    let mut warnings = Vec::new();
    for refs in refs.chunk_by(|a, b| a.file == b.file) {
        let Some(file) = refs.first().map(|r| r.file) else {
            continue;
        };
        let path = ovf_dir.join(ovf::file_name(file));
        let damage = match ovf::read_file(storage, &path, Some(&start.store_id), Some(file)) {
            Ok(entries) => {
                let checked = check_overflow_entries(
                    &path,
                    &entries,
                    refs.iter().map(|r| (r.offset, r.task_id, r.key.as_deref())),
                    Some(&hasher),
                );
                match checked {
                    Ok(()) => continue,
                    Err(f) => return (Some(f), warnings),
                }
            }
            Err(e) => Failure::overflow(&path, &e),
        };
        let Some(replay) = replay else {
            return (Some(damage), warnings);
        };
        let d = DamagedOverflowFile {
            file,
            path,
            missing: damage.cause == Cause::Missing,
            damage,
            refs: refs
                .iter()
                .map(|r| (r.offset, r.task_id, r.key.clone()))
                .collect(),
        };
        match d.judge(storage, &needed_entries(replay, &[file]), &hasher) {
            Ok(warning) => warnings.push(warning),
            Err(f) => return (Some(f), warnings),
        }
    }
    (None, warnings)
}

/// The entries of the overflow file at `path` (as [`ovf::read_file`] returns them: by
/// offset) must hold every entry a checkpoint places there, given as `(offset, task id,
/// key)`: that task's entry at that offset, with that key — or, for a far task, with a key
/// whose hash under `hasher` (the store id's) is the checkpoint's. The error names the file
/// and the offset.
pub(crate) fn check_overflow_entries<'k>(
    path: &Path,
    entries: &[(u64, ovf::Entry)],
    refs: impl IntoIterator<Item = (u64, u64, EntryKey<&'k [u8]>)>,
    hasher: Option<&far::KeyHasher>,
) -> Result<(), Failure> {
    let failure = |offset: u64, message: String| Failure {
        cause: Cause::Damage,
        file: Some(path.to_path_buf()),
        offset: Some(offset),
        message,
    };
    for (offset, id, key) in refs {
        let found = entries
            .binary_search_by_key(&offset, |(o, _)| *o)
            .ok()
            .map(|i| &entries[i].1)
            .filter(|e| e.task_id == id);
        match (found, key) {
            (Some(e), EntryKey::Key(key)) if *e.key == *key => {}
            (_, EntryKey::Key(_)) => {
                return Err(failure(
                    offset,
                    format!(
                        "overflow file {} has no entry of task {id} at byte offset {offset}, where the checkpoint puts its payload",
                        path.display()
                    ),
                ))
            }
            (None, EntryKey::Hash(_)) => {
                return Err(failure(
                    offset,
                    format!(
                        "overflow file {} has no entry of far task {id} at byte offset {offset}, where the checkpoint puts it",
                        path.display()
                    ),
                ))
            }
            (Some(e), EntryKey::Hash(want)) => {
                let got = hasher.map(|h| h.hash(&e.key));
                if got != Some(want) {
                    let got = got.map_or_else(|| "unknown".to_string(), |h| format!("{h:016x}"));
                    return Err(failure(
                        offset,
                        format!(
                            "overflow file {}: the entry of far task {id} at byte offset {offset} has a key whose hash is {got}, the checkpoint says {want:016x}",
                            path.display()
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// An overflow file that the checkpoint the engine's open starts from does not name
/// ([`CheckpointStart::named_files`]; every file when there is no checkpoint): written by a
/// checkpoint that never became durable, or left by an interrupted removal. The open removes
/// it, so damage to it loses nothing: `verify` and `inspect` report it as a warning, not a
/// failure. `kept`: the newest checkpoint is damaged and the open starts from an older one —
/// it then keeps every file (the newest may name it) until the next checkpoint.
pub(crate) fn orphan_damage(path: &Path, kept: bool, damage: Failure) -> Failure {
    let fate = if kept {
        "the open keeps it, as the damaged newest checkpoint may name it, and the next \
         checkpoint removes it"
    } else {
        "the next open removes it"
    };
    Failure {
        message: format!(
            "orphan overflow file {} does not read back, but no checkpoint the engine uses \
             refers to it ({fate}): no data is lost: {}",
            path.display(),
            damage.message
        ),
        ..damage
    }
}

/// The overflow files in `dir` (a data directory's `overflow/`) that `start` does not name
/// (all of them without a checkpoint): each is read whole and checked (its header, with the
/// store id when known, and every entry); a damaged one is a warning ([`orphan_damage`]).
/// Returns the orphans' paths and those warnings (a listing that fails is a warning too:
/// the files the checkpoint names are read and checked apart).
fn check_orphan_overflow_files(
    storage: &dyn Storage,
    dir: &Path,
    start: Option<&CheckpointStart>,
) -> (Vec<PathBuf>, Vec<Failure>) {
    let (files, _) = match ovf::list(storage, dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Default::default(),
        Err(e) => {
            let failure = Failure {
                cause: Cause::of_io(&e),
                file: Some(dir.to_path_buf()),
                offset: None,
                message: format!(
                    "cannot list {} for orphan overflow files: {e}",
                    dir.display()
                ),
            };
            return (Vec::new(), vec![failure]);
        }
    };
    let named = start.map_or(&[][..], |s| s.named_files.as_slice());
    let kept = start.is_some_and(|s| s.newer_damage.is_some());
    let store_id = start.map(|s| s.store_id);
    let (mut orphans, mut warnings) = (Vec::new(), Vec::new());
    for (number, name) in files {
        if named.binary_search(&number).is_ok() {
            continue;
        }
        let path = dir.join(name);
        if let Err(e) = ovf::read_file(storage, &path, store_id.as_ref(), Some(number)) {
            warnings.push(orphan_damage(&path, kept, Failure::overflow(&path, &e)));
        }
        orphans.push(path);
    }
    (orphans, warnings)
}

impl CheckpointStart {
    /// After the whole log was read (its last LSN, and `records_after` records above the
    /// checkpoint's LSN): whether the log holds every record after the checkpoint, as the
    /// engine's open requires — the log's LSNs are dense, so there must be exactly
    /// `last_lsn - lsn` of them. If not, the error is the newest checkpoint file's damage
    /// when this is an older one (the open reports that one), else the mismatch.
    pub(crate) fn check_log(&mut self, last_lsn: u64, records_after: u64) -> Result<(), Failure> {
        let s = &self.summary;
        if last_lsn >= s.lsn && last_lsn - s.lsn == records_after {
            return Ok(());
        }
        Err(self.newer_damage.take().unwrap_or_else(|| Failure {
            cause: Cause::Damage,
            file: Some(s.file.clone()),
            offset: None,
            message: format!(
                "checkpoint {} (LSN {}) does not fit the log: the log ends at LSN {last_lsn} and holds {records_after} records after it",
                s.file.display(),
                s.lsn,
            ),
        }))
    }
}

/// What kind of entry a file type that is not a regular file is, for messages.
fn entry_kind(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_socket() {
            return "socket";
        }
        if t.is_block_device() {
            return "block device";
        }
        if t.is_char_device() {
            return "character device";
        }
    }
    if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symbolic link"
    } else {
        "special file"
    }
}

/// Entries named like the files Kairos keeps — log segments in `log_dir`, and in a data
/// directory `data_dir` (when it is not `log_dir`) checkpoints in `checkpoint/` and overflow
/// files in `overflow/` — that are not regular files: a FIFO, a directory, a symbolic link,
/// a device. The log and the engine list regular files only (`FsStorage`: a FIFO can never
/// block them), so their open passes over such an entry: what it replaced is lost to them
/// (a segment between two others shows as missing; the newest, a checkpoint or an overflow
/// file may not), and a file the engine writes under that name later cannot replace a
/// directory. `verify`, `inspect` and `dump` report each one as a failure. Nothing is opened
/// (the type is read from the directory entry, symbolic links not followed). Also a `LOCK`
/// (the data directory's or the log's) that is a directory, a link to one, or a link to
/// nothing: the engine's open fails to lock it.
pub(crate) fn not_regular_files(data_dir: &Path, log_dir: &Path) -> Vec<Failure> {
    /// A directory, what its files are, and which names are theirs.
    type Place = (PathBuf, &'static str, fn(&str) -> bool);
    let mut places: Vec<Place> = vec![(log_dir.to_path_buf(), "log segment", |name| {
        kairos_wal::format::parse_segment_file_name(name).is_some()
    })];
    if data_dir != log_dir {
        places.push((
            data_dir.join(checkpoint::CHECKPOINT_DIR_NAME),
            "checkpoint",
            |name| checkpoint::parse_file_name(name).is_some(),
        ));
        places.push((
            data_dir.join(ovf::OVERFLOW_DIR_NAME),
            "overflow file",
            |name| ovf::parse_file_name(name).is_some(),
        ));
    }
    let mut found = Vec::new();
    for (dir, what, named_like) in places {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            // A directory that cannot be listed is reported by the reading that needs it.
            continue;
        };
        let mut odd: Vec<(PathBuf, &str)> = entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(named_like))
            .filter_map(|e| {
                let t = e.file_type().ok()?;
                (!t.is_file()).then(|| (e.path(), entry_kind(t)))
            })
            .collect();
        odd.sort();
        // "an overflow file", "a checkpoint".
        let article = if what.starts_with(['a', 'e', 'i', 'o', 'u']) {
            "an"
        } else {
            "a"
        };
        found.extend(odd.into_iter().map(|(path, kind)| Failure {
            cause: Cause::Damage,
            message: format!(
                "{} is a {kind}, not a regular file, though named like {article} {what}: the \
                 engine reads regular files only and passes over it (if it took the place of \
                 {article} {what}, that {what} is lost to the engine)",
                path.display()
            ),
            file: Some(path),
            offset: None,
        }));
    }
    // The engine's open locks the data directory's LOCK and the log's (creating them when
    // missing): a directory in the place of either — or a symbolic link to one — cannot be
    // opened to lock it, so the open fails. (A FIFO there is opened read-write, which does
    // not block, and locked: no failure.)
    let mut locks = vec![log_dir.join(kairos_wal::format::LOCK_FILE_NAME)];
    if data_dir != log_dir {
        locks.insert(0, data_dir.join(kairos_wal::format::LOCK_FILE_NAME));
    }
    for lock in locks {
        let what = if std::fs::metadata(&lock).is_ok_and(|m| m.is_dir()) {
            "a directory"
        } else if std::fs::symlink_metadata(&lock).is_ok_and(|m| m.is_symlink()) && !lock.exists() {
            // The open does not follow it (that would create a file outside the directory).
            "a symbolic link to nothing"
        } else {
            continue;
        };
        found.push(Failure {
            cause: Cause::Damage,
            message: format!(
                "{} is {what} where the engine's lock file belongs: the engine's open cannot \
                 lock it, and fails",
                lock.display()
            ),
            file: Some(lock),
            offset: None,
        });
    }
    found
}

/// Whether `dir` lists a checkpoint file (read or not, damaged or not).
fn has_checkpoint_file(dir: &Path) -> bool {
    checkpoint::list(&FsStorage, dir).is_ok_and(|(files, _)| !files.is_empty())
}

/// Whether `dir`, the parent of a `wal/` directory, is an engine's data directory: it holds a
/// checkpoint file, or both the `LOCK` file every engine's open creates and the `checkpoint/`
/// directory its first checkpoint does (a trimmed log's checkpoint may be gone; the directory
/// stays). Either marker alone is common enough beside a log used on its own, by `kairos-wal`
/// alone, that such a log is then read by itself.
fn is_data_dir(dir: &Path) -> bool {
    let checkpoints = dir.join(checkpoint::CHECKPOINT_DIR_NAME);
    has_checkpoint_file(&checkpoints) || (dir.join("LOCK").is_file() && checkpoints.is_dir())
}

/// The data directory and the log directory to read for `dir` (also used by `dump` and
/// `inspect`): `DIR` and `DIR/wal` if that is a directory. A data directory's `wal/` given by
/// itself ([`is_data_dir`] of its parent) is read with its data directory (a note on stderr
/// says so, naming `command`), both by their real paths: without the checkpoint, every record
/// about a task the checkpoint holds would look orphaned, and a log trimmed by a checkpoint
/// that is gone would pass. Otherwise `DIR` is a lone log directory, read without a
/// checkpoint; both paths returned are then `DIR`.
///
/// If an engine has the log open (its `LOCK` is held), a warning on stderr says that what is
/// read may change under the reader.
pub(crate) fn dirs(dir: &Path, command: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (data_dir, log_dir) = find_dirs(dir, command)?;
    if lock_is_held(&log_dir.join(kairos_wal::format::LOCK_FILE_NAME)) {
        errln!(
            "kairos {command}: warning: {} is open in a running engine (its LOCK is held): \
             files may change while they are read (a checkpoint replaced, segments deleted), \
             so damage reported may be a change seen half-way; stop the engine for an exact \
             reading",
            data_dir.display()
        );
    }
    Ok((data_dir, log_dir))
}

/// Whether some process holds the lock file at `path` (an `flock`, as the log takes it),
/// told from `/proc/locks` without taking the lock: taking it, even shared and for an
/// instant, could make an engine opening at that instant fail with "locked". `false` where
/// that cannot be told (no such file, not Linux).
fn lock_is_held(path: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let (Ok(meta), Ok(locks)) = (
            std::fs::metadata(path),
            std::fs::read_to_string("/proc/locks"),
        ) else {
            return false;
        };
        // `/proc/locks` names a file `MAJOR:MINOR:INODE`, the device numbers in hex (glibc's
        // `major`/`minor` split of `st_dev`).
        let dev = meta.dev();
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        let file = format!("{major:02x}:{minor:02x}:{}", meta.ino());
        locks.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter's line has "->".
            fields.get(1) == Some(&"FLOCK") && fields.get(5) == Some(&file.as_str())
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        false
    }
}

fn find_dirs(dir: &Path, command: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let wal = dir.join("wal");
    if wal.is_dir() {
        return Ok((dir.to_path_buf(), wal));
    }
    // `.`, `..` or a symbolic link may name a `wal/`: look at the real path.
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let parent = real
        .file_name()
        .filter(|name| *name == "wal")
        .and_then(|_| real.parent())
        .filter(|p| is_data_dir(p));
    if let Some(data_dir) = parent {
        errln!(
            "kairos {command}: note: {} is the log of the data directory {}: reading them \
             together",
            dir.display(),
            data_dir.display()
        );
        // The log by its real path too, below the data directory's: what is under the data
        // directory is told apart from the log by comparing paths.
        return Ok((data_dir.to_path_buf(), real.clone()));
    }
    Ok((dir.to_path_buf(), dir.to_path_buf()))
}

/// Replays record bodies with the engine's own rules ([`Replay`]), counting
/// and collecting what does not fit.
#[derive(Debug)]
struct Census {
    records: u64,
    /// Per segment read, oldest first — what the report lists when the scan stops at
    /// damage.
    tallies: Vec<Tally>,
    /// LSN of the last record read (0: none).
    last_read_lsn: u64,
    /// Records at or below this LSN are covered by the checkpoint: counted, not replayed.
    covered: u64,
    /// Records replayed above the checkpoint's LSN.
    after: u64,
    types: TypeCounts,
    replay: Replay,
    bad: u64,
    bad_details: Vec<BadRecord>,
}

impl Default for Census {
    fn default() -> Census {
        Census {
            records: 0,
            tallies: Vec::new(),
            last_read_lsn: 0,
            covered: 0,
            after: 0,
            types: TypeCounts::default(),
            replay: Replay::new(false),
            bad: 0,
            bad_details: Vec::new(),
        }
    }
}

impl Census {
    /// `offset`: the record's byte offset in `file` (its record header).
    fn visit(&mut self, view: RecordView<'_>, file: &Path, offset: u64, far: &FarReader<'_>) {
        self.records += 1;
        Tally::count(&mut self.tallies, file, view.lsn.0);
        self.last_read_lsn = view.lsn.0;
        if view.lsn.0 <= self.covered {
            // Covered by the checkpoint: counted by type, not replayed (the
            // engine skips them too, so one that does not decode is no damage).
            if let Ok(record) = Record::decode(view.record_type, view.body) {
                self.count(&record);
            }
            return;
        }
        self.after += 1;
        let outcome = Record::decode(view.record_type, view.body)
            .map_err(|e| e.to_string())
            .and_then(|record| {
                self.count(&record);
                self.replay
                    .apply_with(&record, &mut |t| far.read(t))
                    .map_err(|e| e.to_string())
            });
        if let Err(reason) = outcome {
            self.bad += 1;
            if self.bad_details.len() < BAD_RECORDS_SHOWN {
                self.bad_details.push(BadRecord {
                    lsn: view.lsn.0,
                    file: file.to_path_buf(),
                    offset,
                    reason,
                });
            }
        }
    }

    fn count(&mut self, record: &Record<'_>) {
        let counter = match record {
            Record::Schedule { .. } => &mut self.types.schedule,
            Record::Cancel { .. } => &mut self.types.cancel,
            Record::Deliver { .. } => &mut self.types.deliver,
            Record::Ack { .. } => &mut self.types.ack,
            Record::Retry { .. } => &mut self.types.retry,
            Record::Dead { .. } => &mut self.types.dead,
            Record::Purge { .. } => &mut self.types.purge,
            Record::Reschedule { .. } => &mut self.types.reschedule,
            Record::Release { .. } => &mut self.types.release,
        };
        *counter += 1;
    }
}

impl Verification {
    fn new(
        storage: &dyn Storage,
        log_dir: PathBuf,
        scan: Result<ScanReport, WalError>,
        census: Census,
    ) -> Verification {
        let (report, error) = match scan {
            Ok(report)
                if report.segments.is_empty() && !Failure::log_creation_cut_short(&log_dir) =>
            {
                (Some(report), Some(Failure::no_log(&log_dir)))
            }
            Ok(report) => (Some(report), None),
            Err(e) => (None, Some(Failure::from(&e))),
        };
        let segments: Vec<Segment> = match &report {
            Some(report) => report.segments.iter().map(Segment::from).collect(),
            // The scan stopped at damage. It reads segments in order and checks each one whole
            // (ending with SEAL) before it reads the next: every segment read is sealed but the
            // damaged one (listed if records were read from it before the damage).
            None => {
                let damaged = error.as_ref().and_then(|e| e.file.as_deref());
                census
                    .tallies
                    .iter()
                    .map(|t| Segment {
                        file: t.file.clone(),
                        bytes: storage
                            .open(&t.file, kairos_wal::storage::OpenMode::Read)
                            .and_then(|f| f.len())
                            .unwrap_or(0),
                        records: t.records,
                        first_lsn: t.first_lsn,
                        last_lsn: t.last_lsn,
                        sealed: (damaged != Some(t.file.as_path())).then_some(true),
                    })
                    .collect()
            }
        };
        let bad_record_details = census.bad_details;
        let warnings = report
            .as_ref()
            .and_then(Failure::torn_mark_slot)
            .into_iter()
            .collect();
        Verification {
            log_dir,
            ok: error.is_none() && census.bad == 0,
            error,
            segments,
            records: census.records,
            last_lsn: report
                .as_ref()
                .map_or(census.last_read_lsn, |r| r.last_lsn.0),
            clean_shutdown: report.as_ref().map(|r| r.clean_shutdown),
            torn_tail: report
                .as_ref()
                .and_then(|r| r.torn_tail.as_ref())
                .map(Torn::from),
            live_tasks: census.replay.live_tasks(),
            far_tasks: census.replay.far_tasks(),
            live_delivered: census.replay.tasks().filter(|t| t.in_flight).count(),
            dead_letters: census.replay.dead_letters(),
            record_types: census.types,
            bad_records: census.bad,
            bad_record_details,
            checkpoint: None,
            warnings,
            orphan_overflow_files: Vec::new(),
            not_regular_files: Vec::new(),
            records_after_checkpoint: census.after,
        }
    }

    fn print(&self) {
        outln!("log directory   {}", self.log_dir.display());
        if let Some(c) = &self.checkpoint {
            outln!(
                "checkpoint      {} at LSN {}: {}; records above it replayed",
                c.file.display(),
                c.lsn,
                c.counts()
            );
        }
        for s in &self.segments {
            outln!(
                "  segment {}  {} bytes, {}, LSN {}..{}{}",
                s.file.display(),
                s.bytes,
                plural(s.records, "record", "records"),
                s.first_lsn,
                s.last_lsn,
                match s.sealed {
                    Some(true) => ", sealed",
                    Some(false) => ", active",
                    None => ", read up to the damage",
                }
            );
        }
        self.print_counts();
        if !self.orphan_overflow_files.is_empty() {
            let names: Vec<String> = self
                .orphan_overflow_files
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            outln!(
                "orphans         {} overflow file{} no checkpoint in use refers to (the engine \
                 removes {}; no data it needs): {}",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                if names.len() == 1 { "it" } else { "them" },
                names.join(", ")
            );
        }
        self.print_verdict();
    }

    fn print_counts(&self) {
        let t = &self.record_types;
        if self.segments.is_empty() && self.records == 0 {
            return;
        }
        if !self.segments.is_empty() {
            outln!("segments        {}", self.segments.len());
        }
        // The four every log has, then the others present.
        let counts = [
            ("schedule", t.schedule, true),
            ("cancel", t.cancel, true),
            ("deliver", t.deliver, true),
            ("ack", t.ack, true),
            ("retry", t.retry, false),
            ("dead", t.dead, false),
            ("purge", t.purge, false),
            ("reschedule", t.reschedule, false),
            ("release", t.release, false),
        ]
        .iter()
        .filter(|(_, n, always)| *always || *n > 0)
        .map(|(name, n, _)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
        outln!(
            "records         {}{} ({counts})",
            self.records,
            // The log stopped at damage (read whole, the error is elsewhere: a checkpoint,
            // an overflow file).
            if self.error.is_some() && self.clean_shutdown.is_none() {
                " read before the damage"
            } else {
                ""
            },
        );
        if self.clean_shutdown.is_none() || self.segments.is_empty() {
            return;
        }
        outln!("last LSN        {}", self.last_lsn);
        outln!(
            "clean shutdown  {}",
            if self.clean_shutdown == Some(true) {
                "yes"
            } else {
                "no"
            }
        );
        match &self.torn_tail {
            None => outln!("torn tail       none"),
            Some(t) => outln!(
                "torn tail       yes (unsynced; open would truncate {} bytes at {}:{}, from LSN {})",
                t.bytes_truncated,
                t.file.display(),
                t.offset,
                t.first_lost_lsn
            ),
        }
        let far = if self.far_tasks > 0 {
            format!("; {} far, beyond the far span", self.far_tasks)
        } else {
            String::new()
        };
        outln!(
            "live tasks      {} ({} delivered, not acked{far}); {}",
            self.live_tasks,
            self.live_delivered,
            plural(self.dead_letters as u64, "dead letter", "dead letters")
        );
    }

    fn print_verdict(&self) {
        for w in &self.warnings {
            w.print("WARNING");
        }
        if let Some(e) = &self.error {
            e.print("FAILED");
        }
        for f in &self.not_regular_files {
            f.print("FAILED");
        }
        for b in &self.bad_record_details {
            outln!(
                "FAILED: bad record at LSN {} in {} at byte offset {}: {}",
                b.lsn,
                b.file.display(),
                b.offset,
                b.reason
            );
        }
        if self.bad_records > self.bad_record_details.len() as u64 {
            outln!("  … {} bad records in all", self.bad_records);
        }
        match (self.ok, &self.torn_tail) {
            (true, None) => outln!("OK: every record checks"),
            (true, Some(_)) => outln!(
                "OK: every record checks; the torn tail is an unsynced write cut short, not damage"
            ),
            (false, _) => {}
        }
    }
}

impl From<&SegmentInfo> for Segment {
    fn from(s: &SegmentInfo) -> Segment {
        Segment {
            file: s.file.clone(),
            bytes: s.bytes,
            records: s.records,
            first_lsn: s.first_lsn.0,
            last_lsn: s.last_lsn.0,
            sealed: Some(s.sealed),
        }
    }
}

impl From<&TornTail> for Torn {
    fn from(t: &TornTail) -> Torn {
        Torn {
            file: t.file.clone(),
            offset: t.offset,
            bytes_truncated: t.bytes_truncated,
            first_lost_lsn: t.first_lost_lsn.0,
        }
    }
}

impl Failure {
    /// The warning for the torn mark slot of the newest segment `report` found, if any: benign
    /// by `wal/FORMAT.md` ("Mark slots": a crash tears at most the slot being written, and the
    /// next open rewrites it as empty), but worth a word, as the only trace of that crash.
    pub(crate) fn torn_mark_slot(report: &ScanReport) -> Option<Failure> {
        let torn = report.torn_mark_slot.as_ref()?;
        let after_close = if report.clean_shutdown {
            "; the log ends with a clean-close marker, so the crash came in a later run, \
             before any frame it wrote reached the disk (or the slot was damaged from outside: \
             the two look alike)"
        } else {
            ""
        };
        Some(Failure {
            cause: Cause::Damage,
            file: Some(torn.file.clone()),
            offset: Some(torn.offset),
            message: format!(
                "mark slot {} of the newest segment is torn (its checksum does not match): what \
                 a crash while the slot was being written leaves, not damage to any record \
                 (wal/FORMAT.md, \"Mark slots\"); the next open rewrites it as empty{after_close}",
                torn.index
            ),
        })
    }

    /// Overflow file `path` does not read back (`offset` is the damage's, if it is damage).
    pub(crate) fn overflow(path: &Path, e: &ovf::OverflowReadError) -> Failure {
        let offset = match e {
            ovf::OverflowReadError::Corrupt { offset, .. } => Some(*offset),
            _ => None,
        };
        let cause = match e {
            ovf::OverflowReadError::Io { source, .. } => Cause::of_io(source),
            _ => Cause::Damage,
        };
        Failure {
            cause,
            file: Some(path.to_path_buf()),
            offset,
            message: e.to_string(),
        }
    }

    /// Whether `log_dir`, which holds no log segment, is a log whose creation was cut short
    /// before segment 1 existed (`wal/FORMAT.md`, Recovery steps 2 and 3): it holds `META`,
    /// `META.tmp` or a segment's `.seg.tmp`; or it is a data directory's `wal/` holding
    /// nothing but its `LOCK` and temporary files, beside the data directory's `LOCK` — a kill
    /// during the first open, after the directory and before `META`. `open` completes such a
    /// log, so the tools take it as an empty log, not as a directory that is not Kairos's.
    pub(crate) fn log_creation_cut_short(log_dir: &Path) -> bool {
        let Ok(entries) = std::fs::read_dir(log_dir) else {
            return false;
        };
        use kairos_wal::format::{LOCK_FILE_NAME, META_FILE_NAME, SEGMENT_SUFFIX, TMP_SUFFIX};
        let (mut begun, mut only_lock_and_tmp) = (false, true);
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let tmp_of = name.strip_suffix(TMP_SUFFIX);
            begun |= name == META_FILE_NAME
                || tmp_of == Some(META_FILE_NAME)
                || tmp_of.is_some_and(|n| n.ends_with(SEGMENT_SUFFIX));
            only_lock_and_tmp &= name == LOCK_FILE_NAME || tmp_of.is_some();
        }
        let data_dir_lock = log_dir
            .parent()
            .filter(|_| log_dir.file_name().is_some_and(|name| name == "wal"))
            .is_some_and(|data_dir| data_dir.join(LOCK_FILE_NAME).is_file());
        begun || (only_lock_and_tmp && data_dir_lock)
    }

    /// A directory without a single log segment: nothing to verify. The message says what
    /// is there instead when `dir` looks like a data directory that lost its log (a `wal`
    /// that is not a directory; a checkpoint or overflow directory without a `wal/`).
    pub(crate) fn no_log(dir: &Path) -> Failure {
        let wal = dir.join("wal");
        let data_parts: Vec<&str> = [checkpoint::CHECKPOINT_DIR_NAME, ovf::OVERFLOW_DIR_NAME]
            .into_iter()
            .filter(|name| dir.join(name).is_dir())
            .collect();
        let message = if wal.exists() && !wal.is_dir() {
            format!(
                "{} is not a directory: the data directory's log is not there",
                wal.display()
            )
        } else if !data_parts.is_empty() {
            format!(
                "no log segments in {}, which has {} but no wal/ directory: the data \
                 directory's log is missing",
                dir.display(),
                data_parts
                    .iter()
                    .map(|p| format!("{p}/"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            )
        } else {
            format!(
                "no log segments in {}: not a Kairos data or log directory",
                dir.display()
            )
        };
        Failure {
            cause: Cause::Damage,
            file: Some(dir.to_path_buf()),
            offset: None,
            message,
        }
    }

    /// Prints `LABEL: message` on stdout, then the file and the byte offset on lines of
    /// their own.
    pub(crate) fn print(&self, label: &str) {
        outln!("{}", self.describe(label).trim_end_matches('\n'));
    }

    /// What [`Failure::print`] prints (each line ends with a newline).
    pub(crate) fn describe(&self, label: &str) -> String {
        let mut out = format!("{label}: {}\n", self.message);
        if let Some(file) = &self.file {
            out.push_str(&format!("  file    {}\n", file.display()));
        }
        if let Some(offset) = self.offset {
            out.push_str(&format!("  offset  {offset} (byte offset in the file)\n"));
        }
        out
    }
}

impl From<&WalError> for Failure {
    fn from(e: &WalError) -> Failure {
        let (file, offset) = match e {
            WalError::Corrupt { file, offset, .. } | WalError::Replay { file, offset, .. } => {
                (Some(file.clone()), Some(*offset))
            }
            WalError::ForeignSegment { file }
            | WalError::MissingSegment { file, .. }
            | WalError::UnsupportedVersion { file, .. } => (Some(file.clone()), None),
            WalError::Io { path, .. } => (Some(path.clone()), None),
            _ => (None, None),
        };
        let cause = match e {
            WalError::Io { source, .. } => Cause::of_io(source),
            _ => Cause::Damage,
        };
        Failure {
            cause,
            file,
            offset,
            message: e.to_string(),
        }
    }
}
