//! `kairos dump DIR`: every record of a data directory's log, one per line,
//! in LSN order — as text or as JSON Lines.
//!
//! Read-only and safe on an untrusted directory: the log is read through
//! `kairos_wal::scan_located` (lengths checked before anything is allocated,
//! no memory maps) and each record is printed as soon as it is read, so
//! memory does not grow with the log. Each body is decoded with
//! `kairos::record::Record::decode`; one that does not decode is printed as
//! such and the dump goes on.

use super::describe::{self, file_name, preview, quoted, rfc3339, task_id, type_name};
use super::verify::{log_dir, Failure, Torn};
use super::Verdict;
use anyhow::Context as _;
use clap::Args;
use kairos::record::{DecodeError, Record};
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

DIR is an engine data directory (its log is DIR/wal) or a log directory itself. Each line has \
the record's LSN, its segment file and byte offset, its type (SCHEDULE, CANCEL, DELIVER, ACK, \
RETRY, DEAD, PURGE, RESCHEDULE, RELEASE, or UNKNOWN(n)), its task id and the fields of its body:

  1 0000000000000001-0000000000000001.seg:96 SCHEDULE task=1 due=2030-01-02T03:04:05.678Z \
key=\"order:1\" payload=\"cancel order 1\" payload_bytes=14

Times (due, fired, dead) are RFC 3339 in UTC with milliseconds; one past the year 9999 is \
printed as the raw integer (due_ms=…). Keys, payloads and error texts are quoted with control \
characters escaped and bytes that are not UTF-8 as \\xNN; payloads are cut to their first 64 \
bytes (marked ... after the closing quote) unless --full-payload. A body that does not decode \
is printed as a line saying so, and the dump goes on.

--key K keeps the records of the tasks that ever had key K: each SCHEDULE with that key, and \
every later record naming its task id — the task's whole history, through retries, \
reschedules, dead-lettering and purge, and a task requeued under the same key.

--json prints one JSON object per line (JSON Lines) with the raw *_ms integers and the RFC 3339 \
strings both (null past the year 9999).

A summary goes to stderr: the records read, a torn tail (an unsynced write cut short by a \
crash, which the next open truncates: reported, not damage), or the damage that stopped the \
scan, with its file and byte offset, after the records read before it.

Exit status 0 when the whole log was read and every body decodes (a torn tail included); 1 if \
the log is damaged (records before the damage are printed first), a body does not decode, or \
the directory cannot be read.")]
pub struct DumpArgs {
    /// Data directory (or its `wal` log directory).
    #[arg(value_name = "DIR")]
    dir: PathBuf,
    /// Only the records of the tasks that ever had this key.
    #[arg(long, value_name = "K")]
    key: Option<OsString>,
    /// Print one JSON object per line (JSON Lines) instead of text.
    #[arg(long)]
    json: bool,
    /// Print payloads whole (default: their first 64 bytes, and their length).
    #[arg(long)]
    full_payload: bool,
    /// Largest record body accepted, bytes: a longer length field is damage.
    #[arg(long, value_name = "B", default_value_t = kairos_wal::RECORD_BYTES_MAX_DEFAULT)]
    record_bytes_max: u32,
}

/// Runs the dump: records to stdout as they are read, the summary to stderr.
pub fn run(args: &DumpArgs) -> anyhow::Result<Verdict> {
    let log_dir = log_dir(&args.dir)?;
    let stdout = io::stdout().lock();
    let mut dumper = Dumper::new(args, BufWriter::new(stdout));
    let scan = kairos_wal::scan_located(
        &FsStorage,
        &log_dir,
        args.record_bytes_max,
        &mut |view, place| dumper.visit(view, place),
    );
    dumper.flush();
    if let Some(e) = dumper.write_error.take() {
        return Err(e).context("cannot write the dump to stdout");
    }
    Ok(dumper.summarize(&log_dir, &scan))
}

/// Prints records as the scan hands them over.
struct Dumper<W: Write> {
    out: W,
    json: bool,
    payload_limit: Option<usize>,
    /// `--key`, as bytes.
    key: Option<Vec<u8>>,
    /// With `--key`: the ids of the tasks scheduled with it so far.
    tasks: Vec<u64>,
    task_set: HashSet<u64>,
    records: u64,
    shown: u64,
    undecodable: u64,
    /// The first undecodable record: its LSN.
    first_undecodable: Option<u64>,
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
            records: 0,
            shown: 0,
            undecodable: 0,
            first_undecodable: None,
            line: String::new(),
            write_error: None,
        }
    }

    fn visit(&mut self, view: RecordView<'_>, place: RecordPlace<'_>) {
        self.records += 1;
        let decoded = Record::decode(view.record_type, view.body);
        if decoded.is_err() {
            self.undecodable += 1;
            self.first_undecodable.get_or_insert(view.lsn.0);
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
            match serde_json::to_string(&line) {
                Ok(text) => self.line.push_str(&text),
                Err(e) => {
                    let error = serde_json::Value::String(e.to_string());
                    let _ = write!(
                        self.line,
                        "{{\"lsn\":{},\"json_error\":{error}}}",
                        view.lsn.0
                    );
                }
            }
        } else {
            text_line(&mut self.line, view, place, &decoded, self.payload_limit);
        }
        self.line.push('\n');
        if let Err(e) = self.out.write_all(self.line.as_bytes()) {
            self.write_failed(e);
        }
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
    fn summarize(&self, log_dir: &Path, scan: &Result<ScanReport, WalError>) -> Verdict {
        let mut ok = self.undecodable == 0;
        let mut summary = String::new();
        match scan {
            Ok(report) if report.segments.is_empty() => {
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
                    "kairos dump: {} records{lsns}, in {} segments of {}; clean shutdown: {}",
                    self.records,
                    report.segments.len(),
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
                let _ = writeln!(summary, "kairos dump: damaged log: {}", failure.message);
                if let Some(file) = &failure.file {
                    let _ = writeln!(summary, "  file    {}", file.display());
                }
                if let Some(offset) = failure.offset {
                    let _ = writeln!(summary, "  offset  {offset} (byte offset in the file)");
                }
                let _ = writeln!(
                    summary,
                    "kairos dump: the {} records read before the damage are printed above",
                    self.records
                );
            }
        }
        if let Some(key) = &self.key {
            let ids: Vec<String> = self.tasks.iter().map(u64::to_string).collect();
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
                "kairos dump: {} of {} records shown: {whose}",
                self.shown, self.records
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
        eprint!("{summary}");
        if ok {
            Verdict::Pass
        } else {
            Verdict::Fail
        }
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
    /// RESCHEDULE: whether the task keeps its payload (then no payload fields).
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_kept: Option<bool>,
    /// UTF-8, lossily; its first bytes unless `--full-payload`.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<String>,
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
        self.payload_bytes = Some(payload.len());
        self.payload_truncated = Some(cut);
    }
}
