//! `kairos dump DIR`: every record of a data directory's log, one per line,
//! in LSN order — as text or as JSON Lines.
//!
//! Read-only and safe on an untrusted directory: the log is read through
//! `kairos_wal::scan_located` (lengths checked before anything is allocated,
//! no memory maps) and each record is printed as soon as it is read, so
//! memory does not grow with the log. Each body is decoded with
//! `kairos::record::Record::decode`; one that does not decode is printed as
//! such and the dump goes on. The records above the checkpoint are also
//! replayed on its state with the engine's rules (`kairos::replay::Replay`,
//! as `verify` and `inspect` do: memory follows the live tasks, not the
//! log), so a log the engine would refuse fails the dump too.
//!
//! The log's older records are deleted once a checkpoint holds their effect,
//! so the dump starts with the checkpoint the engine's open would start from
//! (`verify`'s `start_from_checkpoint`), and `--key` shows the state it holds
//! for the key's tasks where their history reaches its LSN.

use super::describe::{self, file_name, preview, quoted, rfc3339, task_id, type_name};
use super::verify::{
    check_overflow_refs_after_log, dirs, missing_checkpoint, needed_entries, not_regular_files,
    start_from_checkpoint_deferring_overflow, Cause, CheckpointStart, Failure, FarReader, Torn,
};
use super::{plural, Verdict};
use anyhow::Context as _;
use clap::builder::TypedValueParser as _;
use clap::Args;
use kairos::checkpoint as ckpt;
use kairos::far::KeyHasher;
use kairos::overflow as ovf;
use kairos::record::{DecodeError, Record};
use kairos::replay::Replay;
use kairos_wal::{FsStorage, RecordPlace, RecordView, ScanReport, WalError};
use serde::Serialize;
use std::borrow::Cow;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Payload bytes shown unless `--full-payload`.
const PAYLOAD_SHOWN_BYTES: usize = 64;

/// Print every record of a data directory's log, one per line.
#[derive(Debug, Args)]
#[command(long_about = "\
Print every record of a data directory's log, one per line, in LSN order. Offline and \
read-only.

DIR is an engine data directory (its log is DIR/wal) or a log directory itself (a data \
directory's wal/ given alone, beside a checkpoint or beside the engine's LOCK file and a \
checkpoint/ directory, is read as its data directory, with the checkpoint and the overflow \
files beside it; a log read alone that was trimmed — its first LSN above 1, the records \
before it held by a checkpoint that is not there — fails as a data directory whose checkpoint is \
missing does). Each line has \
the record's LSN, its segment file and byte offset, its type (SCHEDULE, CANCEL, DELIVER, ACK, \
RETRY, DEAD, PURGE, RESCHEDULE, RELEASE, or UNKNOWN(n)), its task id and the fields of its body:

  1 0000000000000001-0000000000000001.seg:160 SCHEDULE task=1 due=2030-01-02T03:04:05.678Z \
key=\"order:1\" payload=\"cancel order 1\" payload_bytes=14

Times (due, fired, dead) are RFC 3339 in UTC with milliseconds; one past the year 9999 is \
printed as the raw integer (due_ms=…). Keys, payloads and error texts are quoted with control \
characters escaped and bytes that are not UTF-8 as \\xNN; payloads are cut to their first 64 \
bytes (marked ... after the closing quote) unless --full-payload. A body that does not decode \
is printed as a line saying so, and the dump goes on.

When the data directory has a checkpoint (DIR/checkpoint/*.ckpt; the engine then deletes the \
log segments it covers), the first line names the one the engine's open would start from — the \
newest that reads back whole:

  checkpoint 0000000000000123.ckpt at LSN 291: 40 live tasks, 1 dead letter

If it holds far tasks (tasks beyond the far span, whose key, due time and payload are only in \
their overflow entry), the count names them (40 live tasks, 3 far tasks, 1 dead letter) and \
one line per far task follows, by id: its id, the 64-bit hash of its key (SipHash-1-3 keyed by \
the store id, 16 hex digits), and the number of the overflow file and the byte offset of its \
entry:

  FAR task=12 key_hash=ffcb7e869b80484e file=3 offset=64

The records still in the log follow, those at or below its LSN included.

--key K keeps the records of the tasks that ever had key K: each SCHEDULE with that key, and \
every later record naming its task id — the task's whole history, through retries, \
reschedules, dead-lettering and purge, and a task requeued under the same key. With a \
checkpoint, the state it holds for every task with key K stands for the records it covers, \
printed where the log passes its LSN (after the records at or below it still in the log, \
before those above it), one line per task:

  CHECKPOINT task=7 key=\"order:1\" due=2030-01-02T03:04:05.678Z deliveries=0 in_flight=false
  DEAD_LETTER task=5 key=\"order:1\" due=… deliveries=3 dead=… error=\"boom\"

A far task has key K if K hashes to its key hash and its overflow entry, read to make sure, \
holds K (two keys may share a hash); its line then has the key and the due time too:

  FAR task=12 key=\"order:1\" due=2030-01-02T03:04:05.678Z key_hash=ffcb7e869b80484e file=3 \
offset=64

--json prints one JSON object per line (JSON Lines) with the raw *_ms integers and the RFC 3339 \
strings both (null past the year 9999). The checkpoint line is an object with \"type\": \
\"CHECKPOINT\" (file, path, lsn, created, bytes, max_task_id, tasks, far_tasks, \
dead_letters); a far task's, \"type\": \"FAR_TASK\" (checkpoint_lsn, task_id, key_hash as \
16 hex digits, file, offset; with --key also key, due_ms and due); the other state lines of \
--key have \"type\": \"CHECKPOINT_TASK\" or \"DEAD_LETTER\" and checkpoint_lsn. Keys, payloads \
and error texts are strings, UTF-8 lossily; a key or a payload that is not valid UTF-8 also \
comes as key_hex or payload_hex, its exact bytes (the payload's shown part) in hex.

A summary goes to stderr: the records read, a torn tail (an unsynced write cut short by a \
crash, which the next open truncates: reported, not damage), a torn mark slot of the newest \
segment (a warning: what a crash while it was being written leaves, which the next open \
rewrites as empty), or the damage that stopped the scan, with its file and byte offset, after the records read before it. A checkpoint that does \
not read back is reported with its file and byte offset, and the log is dumped without it; if \
an older one reads and the log still holds every record after it, the engine opens from that \
one and so does the dump (the newest one's damage is then a warning) — but not past a file \
that could not be read at all (an I/O error): the engine's open fails on it, and the dump goes \
on without a checkpoint. The overflow files the \
checkpoint refers to are read and checked too. Each file that fails is called damaged (its \
bytes were read and are wrong), unreadable (an I/O error, printed: permission denied, not a \
regular file) or missing.

The records above the checkpoint (all of them without one) are replayed with the rules the \
engine applies at open, as `kairos verify` replays them; the first that breaks them (a cancel \
of a task that is not live, an ack of one not delivered, …) is named in the summary by LSN, \
file and byte offset.

Exit status 0 when the checkpoint reads, the log holds every record after it, the whole log \
was read, every body decodes and every record replays (a torn tail included); 1 if a \
checkpoint or the log is damaged or unreadable (records before the damage are printed first), \
an overflow file the checkpoint refers to is damaged, unreadable or missing, a body does not \
decode, a record breaks the replay rules, the log was \
trimmed and the checkpoint that covered its start is missing, an entry named like a log \
segment, a checkpoint or an overflow file is not a regular file (a FIFO, a directory: the \
engine passes over it), a LOCK is a directory or a dangling link (the engine's open cannot lock it), or the \
directory cannot be read.")]
pub struct DumpArgs {
    /// Data directory (or its `wal` log directory).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Only the records of the tasks that ever had this key (not empty: no task has an empty
    /// key). A key that begins with '-' is given as `--key=-x` (`--key -x` reads `-x` as an
    /// option; one that reads as a number, `--key -5`, is taken as the key).
    #[arg(long, value_name = "K",
          value_parser = clap::builder::OsStringValueParser::new().try_map(non_empty_key))]
    key: Option<OsString>,
    /// Print one JSON object per line (JSON Lines) instead of text.
    #[arg(long)]
    json: bool,
    /// Print payloads whole (default: their first 64 bytes, and their length).
    #[arg(long)]
    full_payload: bool,
    /// Largest record body accepted, bytes: a longer length field is damage. At least 23
    /// (the smallest SCHEDULE body).
    #[arg(long, value_name = "B", default_value_t = kairos_wal::RECORD_BYTES_MAX_DEFAULT,
          value_parser = super::verify::parse_record_bytes_max)]
    record_bytes_max: u32,
}

/// `--key`: refuses an empty key (a usage error), which no task can have.
fn non_empty_key(key: OsString) -> Result<OsString, String> {
    if key.is_empty() {
        Err("a task's key is never empty".to_owned())
    } else {
        Ok(key)
    }
}

/// Runs the dump: records to stdout as they are read, the summary to stderr.
pub fn run(args: &DumpArgs) -> anyhow::Result<Verdict> {
    let (data_dir, log_dir) = dirs(&args.dir, "dump")?;
    // As `verify` does: a log directory given by itself is read without a checkpoint.
    let start = if log_dir == data_dir {
        Ok(None)
    } else {
        // The overflow files are checked apart: a damaged one is reported as such, and the
        // checkpoint (which reads fine) is still dumped.
        start_from_checkpoint_deferring_overflow(
            &FsStorage,
            &data_dir.join(ckpt::CHECKPOINT_DIR_NAME),
            &log_dir,
        )
    };
    let stdout = io::stdout().lock();
    let mut dumper = Dumper::new(args, BufWriter::new(stdout));
    let mut checkpoint = match start {
        Ok(start) => start,
        Err(failure) => {
            dumper.checkpoint_failure = Some(failure);
            // No state to replay the records on (the engine would not open).
            dumper.replay = None;
            None
        }
    };
    // The overflow files are checked after the log: damage in entries no task live at its
    // end needs is a warning (as `verify` reports it).
    let mut overflow_refs = Vec::new();
    if let Some(c) = checkpoint.as_mut() {
        overflow_refs = std::mem::take(&mut c.overflow_refs);
        dumper.start_at(c);
        dumper.replay = Some(std::mem::take(&mut c.replay));
        dumper.far = Some(FarReader::new(&FsStorage, Some(c)));
    }
    let scan = kairos_wal::scan_located(
        &FsStorage,
        &log_dir,
        args.record_bytes_max,
        &mut |view, place| dumper.visit(view, place),
    );
    if let Some(c) = &checkpoint {
        let replayed = scan.is_ok() && dumper.undecodable == 0 && dumper.unreplayable == 0;
        let (failure, warnings) = check_overflow_refs_after_log(
            &FsStorage,
            c,
            &overflow_refs,
            dumper.replay.as_ref().filter(|_| replayed),
        );
        dumper.overflow_failure = failure;
        dumper.overflow_warnings = warnings;
        // `--key` could not read a far task's entry to compare its key: that fails the dump
        // only if something live at the end of the log needs the entry (the engine would meet
        // the damage); if its task finished since, the engine opens and never reads it.
        // Each such entry is judged on its own (a key's hash can be two far tasks').
        let replay = dumper.replay.as_ref().filter(|_| replayed);
        let files: Vec<u32> = dumper.far_failures.iter().map(|f| f.entry.0).collect();
        let needed = replay.map(|r| needed_entries(r, &files));
        for f in &mut dumper.far_failures {
            f.needed = needed.as_ref().is_none_or(|n| n.contains_key(&f.entry));
        }
        // A far task a record needed whole, its entry unread, live at the end: the engine's
        // open refuses the directory (the check above names the entry when it finds it
        // damaged; this covers an entry that could not be read otherwise).
        if dumper.overflow_failure.is_none() {
            let unresolved = dumper
                .replay
                .as_ref()
                .filter(|_| replayed)
                .and_then(|r| r.unresolved_at_end().err());
            dumper.overflow_failure = unresolved.map(|held| Failure {
                file: c
                    .overflow_dir
                    .as_ref()
                    .map(|d| d.join(kairos::overflow::file_name(held.task.file))),
                offset: Some(held.task.offset),
                message: held.to_string(),
                cause: Cause::Damage,
            });
        }
    }
    dumper.write_state();
    dumper.flush();
    if let Some(e) = dumper.write_error.take() {
        return Err(e).context("cannot write the dump to stdout");
    }
    let not_regular = not_regular_files(&data_dir, &log_dir);
    Ok(dumper.summarize(
        &log_dir,
        log_dir != data_dir,
        &scan,
        checkpoint,
        &not_regular,
    ))
}

/// With `--key`: a far task's overflow entry that could not be read to compare its key.
#[derive(Debug)]
struct FarFailure {
    /// Why, naming the task, the file and the offset.
    failure: Failure,
    /// The entry's overflow file and offset.
    entry: (u32, u64),
    /// Whether a task or dead letter live at the end of the log needs the entry (or the log
    /// did not replay to its end). Only then does it fail the dump; otherwise it is a warning,
    /// as `verify` reports such damage.
    needed: bool,
}

/// Prints records as the scan hands them over.
struct Dumper<W: Write> {
    out: W,
    json: bool,
    payload_limit: Option<usize>,
    /// `--key`, as bytes.
    key: Option<Vec<u8>>,
    /// With `--key`: the ids of the tasks the checkpoint holds with it, then of those
    /// scheduled with it in the log so far.
    tasks: Vec<u64>,
    task_set: HashSet<u64>,
    /// The LSN of the checkpoint the dump starts from (0: none).
    covered: u64,
    /// Records read above `covered`.
    after: u64,
    /// With `--key` and a checkpoint: the state it holds for the key's tasks, printed
    /// when the log passes its LSN.
    state: Vec<StateLine>,
    /// How many state lines there were.
    state_shown: usize,
    /// Why no checkpoint could be started from.
    checkpoint_failure: Option<Failure>,
    /// The first damage found in the overflow files the checkpoint refers to.
    overflow_failure: Option<Failure>,
    /// Damage in overflow entries no live task needs.
    overflow_warnings: Vec<Failure>,
    /// With `--key`: the far tasks' overflow entries that could not be read to compare their
    /// key with it, in the order they were tried (each entry once).
    far_failures: Vec<FarFailure>,
    records: u64,
    shown: u64,
    undecodable: u64,
    /// Undecodable records at or below `covered` (the engine skips them).
    undecodable_covered: u64,
    /// The first undecodable record: its LSN.
    first_undecodable: Option<u64>,
    /// The records above `covered` replayed with the engine's rules, on the checkpoint's
    /// state (`None`: not replayed — the checkpoint the engine starts from could not be
    /// read, or the log was trimmed and no checkpoint holds what it starts from).
    replay: Option<Replay>,
    /// Reads the key and due time of a far task a record names.
    far: Option<FarReader<'static>>,
    /// Records above `covered` that decode but break the replay rules.
    unreplayable: u64,
    /// The first of them: its LSN, segment file, byte offset and why.
    first_unreplayable: Option<(u64, PathBuf, u64, String)>,
    /// One line, reused.
    line: String,
    write_error: Option<io::Error>,
}

impl<W: Write> Dumper<W> {
    fn new(args: &DumpArgs, out: W) -> Dumper<W> {
        Dumper {
            out,
            json: args.json,
            payload_limit: (!args.full_payload).then_some(PAYLOAD_SHOWN_BYTES),
            key: args.key.as_ref().map(|k| k.as_encoded_bytes().to_vec()),
            tasks: Vec::new(),
            task_set: HashSet::new(),
            covered: 0,
            after: 0,
            state: Vec::new(),
            state_shown: 0,
            checkpoint_failure: None,
            overflow_failure: None,
            overflow_warnings: Vec::new(),
            far_failures: Vec::new(),
            records: 0,
            shown: 0,
            undecodable: 0,
            undecodable_covered: 0,
            first_undecodable: None,
            replay: Some(Replay::new(false)),
            far: None,
            unreplayable: 0,
            first_unreplayable: None,
            line: String::new(),
            write_error: None,
        }
    }

    /// Starts from checkpoint `c`: prints its line, and with `--key` takes the state it
    /// holds for the key's tasks (printed when the log passes its LSN).
    fn start_at(&mut self, c: &mut CheckpointStart) {
        self.covered = c.summary.lsn;
        self.line.clear();
        let name = file_name(&c.summary.file).into_owned();
        if self.json {
            let line = CheckpointLine {
                type_name: "CHECKPOINT",
                file: name,
                path: c.summary.file.to_string_lossy().into_owned(),
                lsn: c.summary.lsn,
                created_ms: c.created_ms,
                created: rfc3339(c.created_ms),
                bytes: c.bytes,
                max_task_id: c.max_task_id,
                tasks: c.summary.tasks,
                far_tasks: c.summary.far_tasks,
                dead_letters: c.summary.dead_letters,
            };
            self.push_json(&line, c.summary.lsn);
        } else {
            let _ = write!(
                self.line,
                "checkpoint {name} at LSN {}: {}",
                c.summary.lsn,
                c.summary.counts()
            );
        }
        self.write_line();
        let mut far: Vec<ckpt::FarTask> = c.replay.far().copied().collect();
        far.sort_unstable_by_key(|t| t.id);
        let Some(key) = self.key.clone() else {
            for t in &far {
                let line = StateLine {
                    id: t.id,
                    key: Box::default(),
                    due_ms: 0,
                    deliveries: 0,
                    state: State::Far {
                        task: *t,
                        key_read: false,
                    },
                };
                self.write_state_line(&line);
            }
            return;
        };
        let far = self.far_with_key(c, &far, &key);
        let mut state: Vec<StateLine> = c
            .replay
            .tasks_with_ids()
            .filter(|(_, t)| *t.key == *key)
            .map(|(id, t)| StateLine {
                id,
                key: t.key.as_bytes().into(),
                due_ms: t.due_ms,
                deliveries: t.deliveries,
                state: State::Live {
                    in_flight: t.in_flight,
                },
            })
            .chain(
                c.replay
                    .dead_with_ids()
                    .filter(|(_, t)| *t.key == *key)
                    .map(|(id, t)| StateLine {
                        id,
                        key: t.key.clone(),
                        due_ms: t.due_ms,
                        deliveries: t.deliveries,
                        state: State::Dead {
                            dead_ms: t.dead_ms,
                            error: t.error.clone(),
                        },
                    }),
            )
            .chain(far)
            .collect();
        state.sort_by_key(|s| s.id);
        for s in &state {
            if self.task_set.insert(s.id) {
                self.tasks.push(s.id);
            }
        }
        self.state = state;
    }

    /// The far tasks of checkpoint `c` (`far`, sorted by id) whose key is `key`, as state
    /// lines: those whose key hash is `key`'s, confirmed by reading the key from their
    /// overflow entry (another key may have the same hash). An entry that cannot be read is
    /// noted in `far_failures`, as damaged (its bytes are wrong), unreadable (an I/O error) or
    /// missing (its file is not there).
    fn far_with_key(
        &mut self,
        c: &CheckpointStart,
        far: &[ckpt::FarTask],
        key: &[u8],
    ) -> Vec<StateLine> {
        let hash = KeyHasher::new(&c.store_id).hash(key);
        let reader = FarReader::new(&FsStorage, Some(c));
        let mut lines = Vec::new();
        for t in far.iter().filter(|t| t.key_hash == hash) {
            match reader.read_entry(t) {
                Ok((k, due_ms)) if *k == *key => lines.push(StateLine {
                    id: t.id,
                    key: k,
                    due_ms,
                    deliveries: 0,
                    state: State::Far {
                        task: *t,
                        key_read: true,
                    },
                }),
                Ok(_) => {}
                Err(why) => {
                    let entry = (t.file, t.offset);
                    if self.far_failures.iter().any(|f| f.entry == entry) {
                        continue;
                    }
                    let failure = Failure {
                        cause: why.cause,
                        file: c
                            .overflow_dir
                            .as_ref()
                            .map(|d| d.join(ovf::file_name(t.file))),
                        offset: Some(t.offset),
                        message: format!(
                            "cannot read the overflow entry of far task {} (overflow file {}, \
                             offset {}): {}",
                            t.id, t.file, t.offset, why.message
                        ),
                    };
                    self.far_failures.push(FarFailure {
                        failure,
                        entry,
                        needed: true,
                    });
                }
            }
        }
        lines
    }

    /// Prints the checkpoint's state lines, if not yet printed.
    fn write_state(&mut self) {
        let state = std::mem::take(&mut self.state);
        self.state_shown += state.len();
        for s in &state {
            self.write_state_line(s);
        }
    }

    /// Prints one state line.
    fn write_state_line(&mut self, s: &StateLine) {
        self.line.clear();
        if self.json {
            match s.state {
                State::Far { task, key_read } => {
                    let line = FarJson::new(s, task, key_read, self.covered);
                    self.push_json(&line, self.covered);
                }
                _ => {
                    let line = StateJson::new(s, self.covered);
                    self.push_json(&line, self.covered);
                }
            }
        } else {
            s.text(&mut self.line);
        }
        self.write_line();
    }

    /// Puts `value` as JSON in the line (or a line saying why it could not be).
    fn push_json<T: Serialize>(&mut self, value: &T, lsn: u64) {
        match serde_json::to_string(value) {
            Ok(text) => self.line.push_str(&text),
            Err(e) => {
                let error = serde_json::Value::String(e.to_string());
                let _ = write!(self.line, "{{\"lsn\":{lsn},\"json_error\":{error}}}");
            }
        }
    }

    /// Writes the line and a newline, unless a write failed before.
    fn write_line(&mut self) {
        if self.write_error.is_some() {
            return;
        }
        self.line.push('\n');
        if let Err(e) = self.out.write_all(self.line.as_bytes()) {
            self.write_failed(e);
        }
    }

    fn visit(&mut self, view: RecordView<'_>, place: RecordPlace<'_>) {
        self.records += 1;
        if view.lsn.0 > self.covered {
            self.after += 1;
            if !self.state.is_empty() {
                self.write_state();
            }
        }
        let decoded = Record::decode(view.record_type, view.body);
        if self.records == 1 && self.covered == 0 && view.lsn.0 > 1 {
            // A trimmed log without the checkpoint that holds what it starts from (reported
            // at the end): its records name tasks the replay cannot know.
            self.replay = None;
        }
        if let (Ok(record), Some(replay)) = (&decoded, self.replay.as_mut()) {
            if view.lsn.0 > self.covered {
                let far = self.far.as_ref();
                let applied = replay.apply_with(record, &mut |t| match far {
                    Some(far) => far.read(t),
                    None => Err("there is no checkpoint to read it from".into()),
                });
                if let Err(e) = applied {
                    self.unreplayable += 1;
                    self.first_unreplayable.get_or_insert_with(|| {
                        (
                            view.lsn.0,
                            place.file.to_path_buf(),
                            place.offset,
                            e.to_string(),
                        )
                    });
                }
            }
        }
        if decoded.is_err() {
            if view.lsn.0 > self.covered {
                self.undecodable += 1;
                self.first_undecodable.get_or_insert(view.lsn.0);
            } else {
                // The engine's open skips it: the checkpoint holds its effect.
                self.undecodable_covered += 1;
            }
        }
        if let Some(key) = &self.key {
            if let Ok(Record::Schedule { id, key: k, .. }) = &decoded {
                if k == key && self.task_set.insert(id.0) {
                    self.tasks.push(id.0);
                }
            }
            // An undecodable record names no task it could be trusted to belong to.
            let belongs = decoded
                .as_ref()
                .is_ok_and(|r| self.task_set.contains(&task_id(r)));
            if !belongs {
                return;
            }
        }
        self.shown += 1;
        if self.write_error.is_some() {
            return;
        }
        self.line.clear();
        if self.json {
            let line = JsonLine::new(view, place, &decoded, self.payload_limit);
            self.push_json(&line, view.lsn.0);
        } else {
            text_line(&mut self.line, view, place, &decoded, self.payload_limit);
        }
        self.write_line();
    }

    fn flush(&mut self) {
        if self.write_error.is_none() {
            if let Err(e) = self.out.flush() {
                self.write_failed(e);
            }
        }
    }

    /// A closed pipe (`kairos dump DIR | head`) ends the dump quietly, as it
    /// ends other Unix tools; any other write error is reported at the end.
    fn write_failed(&mut self, e: io::Error) {
        if e.kind() == io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        self.write_error = Some(e);
    }

    /// Prints the summary to stderr and decides the exit status.
    /// `data_dir`: whether the log was read as a data directory's (a missing checkpoint then
    /// matters), not given by itself.
    fn summarize(
        &self,
        log_dir: &Path,
        data_dir: bool,
        scan: &Result<ScanReport, WalError>,
        checkpoint: Option<CheckpointStart>,
        not_regular: &[Failure],
    ) -> Verdict {
        let mut ok = self.undecodable == 0 && self.unreplayable == 0 && not_regular.is_empty();
        let mut summary = String::new();
        for f in not_regular {
            summary.push_str(&f.describe("kairos dump: FAILED"));
        }
        // What happened to a file: bad bytes (damaged), an I/O error (unreadable: the error
        // says which), or not there (missing).
        let label =
            |f: &Failure, what: &str| format!("kairos dump: {} {what}", f.cause.adjective());
        if let Some(failure) = &self.overflow_failure {
            ok = false;
            summary.push_str(&failure.describe(&label(failure, "overflow file")));
        }
        for warning in &self.overflow_warnings {
            summary.push_str(&warning.describe("kairos dump: warning"));
        }
        for FarFailure {
            failure, needed, ..
        } in &self.far_failures
        {
            if *needed {
                ok = false;
                // Once per file: `--key` reads far tasks' entries in a file found damaged above.
                let same_file = self
                    .overflow_failure
                    .as_ref()
                    .is_some_and(|f| f.file == failure.file);
                if !same_file {
                    summary.push_str(&failure.describe(&label(failure, "overflow file")));
                }
            } else {
                let note = Failure {
                    message: format!(
                        "{}; no task or dead letter live at the end of the log needs that entry \
                         (its task finished after the checkpoint), so the engine opens and never \
                         reads it; that task is shown only if a record still in the log names \
                         it with the key",
                        failure.message
                    ),
                    ..failure.clone()
                };
                summary.push_str(&note.describe("kairos dump: warning"));
            }
        }
        if let Some(failure) = &self.checkpoint_failure {
            ok = false;
            summary.push_str(&failure.describe(&label(failure, "checkpoint")));
            let _ = writeln!(
                summary,
                "kairos dump: the log is dumped without a checkpoint (the engine would not \
                 open this directory)"
            );
        }
        if let Some(mut c) = checkpoint {
            if let Ok(report) = scan {
                if !report.segments.is_empty() {
                    if let Err(failure) = c.check_log(report.last_lsn.0, self.after) {
                        ok = false;
                        summary.push_str(&failure.describe("kairos dump: FAILED"));
                    }
                }
            }
            if let Some(damage) = &c.newer_damage {
                summary.push_str(&damage.describe("kairos dump: warning"));
                let _ = writeln!(
                    summary,
                    "kairos dump: started from the older checkpoint {} instead, as the engine's \
                     open does",
                    c.summary.file.display()
                );
            }
        } else if self.checkpoint_failure.is_none() {
            let first = scan
                .as_ref()
                .ok()
                .and_then(|r| r.segments.first())
                .map(|s| (s.file.as_path(), s.first_lsn.0));
            if let Some(failure) = missing_checkpoint(first, !data_dir) {
                ok = false;
                summary.push_str(&failure.describe("kairos dump: FAILED"));
            }
        }
        match scan {
            Ok(report)
                if report.segments.is_empty() && !Failure::log_creation_cut_short(log_dir) =>
            {
                ok = false;
                let _ = writeln!(summary, "kairos dump: {}", Failure::no_log(log_dir).message);
            }
            Ok(report) => {
                let lsns = match report.segments.first() {
                    Some(first) if self.records > 0 => {
                        format!(", LSN {}..{}", first.first_lsn.0, report.last_lsn.0)
                    }
                    _ => String::new(),
                };
                let _ = write!(
                    summary,
                    "kairos dump: {}{lsns}, in {} of {}; clean shutdown: {}",
                    plural(self.records, "record", "records"),
                    plural(report.segments.len() as u64, "segment", "segments"),
                    log_dir.display(),
                    if report.clean_shutdown { "yes" } else { "no" },
                );
                summary.push('\n');
                if let Some(t) = &report.torn_tail {
                    let t = Torn::from(t);
                    let _ = writeln!(
                        summary,
                        "kairos dump: torn tail in {} at offset {}: {} bytes from LSN {} (an \
                         unsynced write cut short by a crash; the next open truncates it; not damage)",
                        t.file.display(),
                        t.offset,
                        t.bytes_truncated,
                        t.first_lost_lsn
                    );
                }
                if let Some(torn) = Failure::torn_mark_slot(report) {
                    summary.push_str(&torn.describe("kairos dump: warning"));
                }
                if !report.leftover_segments.is_empty() {
                    let _ = writeln!(
                        summary,
                        "kairos dump: {} leftover segments below the TRIM mark not read (the \
                         next open removes them)",
                        report.leftover_segments.len()
                    );
                }
            }
            Err(e) => {
                ok = false;
                let failure = Failure::from(e);
                let (what, stopped_by) = match failure.cause {
                    Cause::Damage => ("damaged", "the damage"),
                    Cause::Unreadable | Cause::Missing => ("unreadable", "the error"),
                };
                let _ = writeln!(summary, "kairos dump: {what} log: {}", failure.message);
                if let Some(file) = &failure.file {
                    let _ = writeln!(summary, "  file    {}", file.display());
                }
                if let Some(offset) = failure.offset {
                    let _ = writeln!(summary, "  offset  {offset} (byte offset in the file)");
                }
                let _ = writeln!(
                    summary,
                    "kairos dump: printed above: the {} read before {stopped_by}",
                    plural(self.records, "record", "records")
                );
            }
        }
        if let Some(key) = &self.key {
            let ids: Vec<String> = self.tasks.iter().map(u64::to_string).collect();
            let state = match self.state_shown {
                0 => String::new(),
                n => format!(
                    "; the checkpoint at LSN {} holds the state of {}",
                    self.covered,
                    if n == 1 {
                        "1 of them".to_string()
                    } else {
                        format!("{n} of them")
                    }
                ),
            };
            let whose = match ids.len() {
                0 => format!("no task had key {}", quoted(key)),
                1 => format!("the history of task {} (key {})", ids[0], quoted(key)),
                _ => format!(
                    "the histories of tasks {} (key {})",
                    ids.join(", "),
                    quoted(key)
                ),
            };
            let _ = writeln!(
                summary,
                "kairos dump: {} of {} shown: {whose}{state}",
                self.shown,
                plural(self.records, "record", "records")
            );
        }
        if self.undecodable > 0 {
            let _ = writeln!(
                summary,
                "kairos dump: {} record bodies do not decode (the first at LSN {}): the engine \
                 would not open this directory",
                self.undecodable,
                self.first_undecodable.unwrap_or(0)
            );
        }
        if let Some((lsn, file, offset, why)) = &self.first_unreplayable {
            let _ = writeln!(
                summary,
                "kairos dump: FAILED: {} records break the engine's replay rules, the first at \
                 LSN {lsn}: {why} (as `kairos verify` finds): the engine would not open this \
                 directory",
                self.unreplayable
            );
            let _ = writeln!(summary, "  file    {}", file.display());
            let _ = writeln!(summary, "  offset  {offset} (byte offset in the file)");
        }
        if self.undecodable_covered > 0 {
            let _ = writeln!(
                summary,
                "kairos dump: {} record bodies at or below the checkpoint's LSN {} do not decode \
                 (the engine skips them: the checkpoint holds their effect)",
                self.undecodable_covered, self.covered
            );
        }
        errln!("{}", summary.trim_end_matches('\n'));
        if ok {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
    }
}

/// The state a checkpoint holds for one task (`--key`).
#[derive(Debug)]
struct StateLine {
    id: u64,
    key: Box<[u8]>,
    due_ms: u64,
    deliveries: u32,
    state: State,
}

#[derive(Debug)]
enum State {
    Live {
        in_flight: bool,
    },
    Dead {
        dead_ms: u64,
        error: Box<[u8]>,
    },
    /// A far task: `key` and `due_ms` are read from its overflow entry if `key_read`, else
    /// unknown (empty, 0).
    Far {
        task: ckpt::FarTask,
        key_read: bool,
    },
}

impl StateLine {
    /// `CHECKPOINT task=… key=… due=… deliveries=… in_flight=…`, `DEAD_LETTER task=…
    /// key=… due=… deliveries=… dead=… error=…`, or `FAR task=… [key=… due=…] key_hash=…
    /// file=… offset=…`.
    fn text(&self, line: &mut String) {
        let kind = match self.state {
            State::Live { .. } => "CHECKPOINT",
            State::Dead { .. } => "DEAD_LETTER",
            State::Far { task, key_read } => {
                let _ = write!(line, "FAR task={}", self.id);
                if key_read {
                    let _ = write!(line, " key={}", quoted(&self.key));
                    time_field(line, "due", self.due_ms);
                }
                let _ = write!(
                    line,
                    " key_hash={} file={} offset={}",
                    describe::key_hash(task.key_hash),
                    task.file,
                    task.offset
                );
                return;
            }
        };
        let _ = write!(line, "{kind} task={} key={}", self.id, quoted(&self.key));
        time_field(line, "due", self.due_ms);
        let _ = write!(line, " deliveries={}", self.deliveries);
        match &self.state {
            State::Live { in_flight } => {
                let _ = write!(line, " in_flight={in_flight}");
            }
            State::Dead { dead_ms, error } => {
                time_field(line, "dead", *dead_ms);
                let _ = write!(line, " error={}", quoted(error));
            }
            State::Far { .. } => {}
        }
    }
}

/// The checkpoint's line in JSON.
#[derive(Debug, Serialize)]
struct CheckpointLine {
    /// `CHECKPOINT`.
    #[serde(rename = "type")]
    type_name: &'static str,
    /// The file's name (in the checkpoint directory).
    file: String,
    /// Its path, UTF-8 lossily.
    path: String,
    lsn: u64,
    created_ms: u64,
    created: Option<String>,
    bytes: u64,
    max_task_id: u64,
    /// Live tasks it holds whole (far tasks apart).
    tasks: usize,
    /// Far tasks it holds (their lines follow).
    far_tasks: usize,
    dead_letters: usize,
}

/// A far task's line in JSON: the checkpoint's FAR entry, and with `--key` the key and due
/// time read from its overflow entry.
#[derive(Debug, Serialize)]
struct FarJson {
    /// `FAR_TASK`.
    #[serde(rename = "type")]
    type_name: &'static str,
    /// The checkpoint's LSN.
    checkpoint_lsn: u64,
    task_id: u64,
    /// SipHash-1-3 of the key keyed by the store id, 16 lowercase hex digits.
    key_hash: String,
    /// The overflow file's number.
    file: u32,
    /// Byte offset of the task's entry in it.
    offset: u64,
    /// UTF-8, lossily (`--key` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The key's exact bytes in hex, when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    key_hex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    due_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    due: Option<Option<String>>,
}

impl FarJson {
    fn new(s: &StateLine, task: ckpt::FarTask, key_read: bool, checkpoint_lsn: u64) -> FarJson {
        FarJson {
            type_name: "FAR_TASK",
            checkpoint_lsn,
            task_id: task.id,
            key_hash: describe::key_hash(task.key_hash),
            file: task.file,
            offset: task.offset,
            key: key_read.then(|| describe::lossy(&s.key)),
            key_hex: key_read
                .then(|| describe::hex_unless_utf8(&s.key))
                .flatten(),
            due_ms: key_read.then_some(s.due_ms),
            due: key_read.then(|| rfc3339(s.due_ms)),
        }
    }
}

/// A state line of `--key` in JSON.
#[derive(Debug, Serialize)]
struct StateJson {
    /// `CHECKPOINT_TASK` or `DEAD_LETTER`.
    #[serde(rename = "type")]
    type_name: &'static str,
    /// The checkpoint's LSN: the state is the one after every record up to it.
    checkpoint_lsn: u64,
    task_id: u64,
    /// UTF-8, lossily.
    key: String,
    /// The key's exact bytes in hex, when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    key_hex: Option<String>,
    due_ms: u64,
    due: Option<String>,
    deliveries: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    in_flight: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead: Option<Option<String>>,
    /// The error text of its last attempt, UTF-8 lossily.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl StateJson {
    fn new(s: &StateLine, checkpoint_lsn: u64) -> StateJson {
        let mut line = StateJson {
            type_name: "CHECKPOINT_TASK",
            checkpoint_lsn,
            task_id: s.id,
            key: describe::lossy(&s.key),
            key_hex: describe::hex_unless_utf8(&s.key),
            due_ms: s.due_ms,
            due: rfc3339(s.due_ms),
            deliveries: s.deliveries,
            in_flight: None,
            dead_ms: None,
            dead: None,
            error: None,
        };
        match &s.state {
            State::Live { in_flight } => line.in_flight = Some(*in_flight),
            State::Dead { dead_ms, error } => {
                line.type_name = "DEAD_LETTER";
                line.dead_ms = Some(*dead_ms);
                line.dead = Some(rfc3339(*dead_ms));
                line.error = Some(describe::lossy(error));
            }
            // Written as a `FarJson`.
            State::Far { .. } => line.type_name = "FAR_TASK",
        }
        line
    }
}

/// One record as a line of text (without the newline).
fn text_line(
    line: &mut String,
    view: RecordView<'_>,
    place: RecordPlace<'_>,
    decoded: &Result<Record<'_>, DecodeError>,
    payload_limit: Option<usize>,
) {
    let _ = write!(
        line,
        "{} {}:{} {}",
        view.lsn.0,
        file_name(place.file),
        place.offset,
        type_name(view.record_type)
    );
    let record = match decoded {
        Ok(record) => record,
        Err(e) => {
            let _ = write!(line, " body_bytes={} undecodable: {e}", view.body.len());
            return;
        }
    };
    let _ = write!(line, " task={}", task_id(record));
    match *record {
        Record::Schedule {
            due_ms,
            key,
            payload,
            ..
        } => {
            time_field(line, "due", due_ms);
            let _ = write!(line, " key={}", quoted(key));
            payload_field(line, payload, payload_limit);
        }
        Record::Deliver { fired_ms, .. } => time_field(line, "fired", fired_ms),
        Record::Retry { due_ms, error, .. } => {
            time_field(line, "due", due_ms);
            let _ = write!(line, " error={}", quoted(error));
        }
        Record::Dead { dead_ms, error, .. } => {
            time_field(line, "dead", dead_ms);
            let _ = write!(line, " error={}", quoted(error));
        }
        Record::Reschedule {
            due_ms, payload, ..
        } => {
            time_field(line, "due", due_ms);
            match payload {
                None => line.push_str(" payload=kept"),
                Some(p) => payload_field(line, p, payload_limit),
            }
        }
        Record::Cancel { .. }
        | Record::Ack { .. }
        | Record::Purge { .. }
        | Record::Release { .. } => {}
    }
}

/// ` NAME=2030-01-02T03:04:05.678Z`, or ` NAME_ms=N` past the year 9999.
fn time_field(line: &mut String, name: &str, ms: u64) {
    let _ = match rfc3339(ms) {
        Some(time) => write!(line, " {name}={time}"),
        None => write!(line, " {name}_ms={ms}"),
    };
}

/// ` payload="…" payload_bytes=N`, with `...` after the quote if cut.
fn payload_field(line: &mut String, payload: &[u8], limit: Option<usize>) {
    let (shown, cut) = preview(payload, limit);
    let _ = write!(
        line,
        " payload={}{} payload_bytes={}",
        quoted(shown),
        if cut { "..." } else { "" },
        payload.len()
    );
}

/// One record as a line of JSON. Fields a record type does not have are
/// left out; a time past the year 9999 has its `*_ms` integer and `null`.
#[derive(Debug, Default, Serialize)]
struct JsonLine<'a> {
    lsn: u64,
    /// The segment file's name (in the log directory).
    file: Cow<'a, str>,
    /// Byte offset of the record in `file`.
    offset: u64,
    /// Byte offset of its frame in `file`.
    frame_offset: u64,
    #[serde(rename = "type")]
    type_name: Cow<'static, str>,
    record_type: u8,
    body_bytes: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    task_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    due_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    due: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fired_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fired: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dead: Option<Option<String>>,
    /// UTF-8, lossily.
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<String>,
    /// The key's exact bytes in hex, when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    key_hex: Option<String>,
    /// RESCHEDULE: whether the task keeps its payload (then no payload fields).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_kept: Option<bool>,
    /// UTF-8, lossily; its first bytes unless `--full-payload`.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<String>,
    /// The exact bytes `payload` shows, in hex, when they are not valid UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_hex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_bytes: Option<usize>,
    /// Whether `payload` is cut short.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_truncated: Option<bool>,
    /// RETRY and DEAD: the error text, UTF-8 lossily.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Why the body does not decode.
    #[serde(skip_serializing_if = "Option::is_none")]
    decode_error: Option<String>,
}

impl<'a> JsonLine<'a> {
    fn new(
        view: RecordView<'_>,
        place: RecordPlace<'a>,
        decoded: &Result<Record<'_>, DecodeError>,
        payload_limit: Option<usize>,
    ) -> JsonLine<'a> {
        let mut line = JsonLine {
            lsn: view.lsn.0,
            file: file_name(place.file),
            offset: place.offset,
            frame_offset: place.frame_offset,
            type_name: type_name(view.record_type),
            record_type: view.record_type,
            body_bytes: view.body.len(),
            ..JsonLine::default()
        };
        let record = match decoded {
            Ok(record) => record,
            Err(e) => {
                line.decode_error = Some(e.to_string());
                return line;
            }
        };
        line.task_id = Some(task_id(record));
        let time = |ms: u64| (Some(ms), Some(rfc3339(ms)));
        match *record {
            Record::Schedule {
                due_ms,
                key,
                payload,
                ..
            } => {
                (line.due_ms, line.due) = time(due_ms);
                line.key = Some(describe::lossy(key));
                line.key_hex = describe::hex_unless_utf8(key);
                line.set_payload(payload, payload_limit);
            }
            Record::Deliver { fired_ms, .. } => (line.fired_ms, line.fired) = time(fired_ms),
            Record::Retry { due_ms, error, .. } => {
                (line.due_ms, line.due) = time(due_ms);
                line.error = Some(describe::lossy(error));
            }
            Record::Dead { dead_ms, error, .. } => {
                (line.dead_ms, line.dead) = time(dead_ms);
                line.error = Some(describe::lossy(error));
            }
            Record::Reschedule {
                due_ms, payload, ..
            } => {
                (line.due_ms, line.due) = time(due_ms);
                line.payload_kept = Some(payload.is_none());
                if let Some(p) = payload {
                    line.set_payload(p, payload_limit);
                }
            }
            Record::Cancel { .. }
            | Record::Ack { .. }
            | Record::Purge { .. }
            | Record::Release { .. } => {}
        }
        line
    }

    fn set_payload(&mut self, payload: &[u8], limit: Option<usize>) {
        let (shown, cut) = preview(payload, limit);
        self.payload = Some(describe::lossy(shown));
        self.payload_hex = describe::hex_unless_utf8(shown);
        self.payload_bytes = Some(payload.len());
        self.payload_truncated = Some(cut);
    }
}
