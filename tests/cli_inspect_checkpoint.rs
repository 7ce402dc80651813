//! `kairos inspect` and `kairos dump` on a checkpointed data directory: a directory is built
//! through the library (real file system, manual clock, 4 KiB segments, no background
//! checkpoints), checkpointed with `Engine::checkpoint` so the log's older segments are
//! deleted, then changed further — a task scheduled before the checkpoint is cancelled
//! after it. The commands must start from the checkpoint as the engine's open does: task
//! counts equal to the engine's `Stats`, the checkpoint's LSN equal to its report, one
//! task's history whole across the checkpoint, and a damaged checkpoint named by file and
//! byte offset (or, with an older one the log still covers, reported as a warning).

#![cfg(feature = "cli")]

mod common;

use common::cli::{copy_tree, json, json_lines, path, run};
use common::{open_fs, TestResult, START_MS};
use kairos::checkpoint::{file_name, CheckpointReadError, CHECKPOINT_DIR_NAME};
use kairos::{Config, Durability, Engine, ManualClock, NackOutcome, Stats};
use kairos_wal::FsStorage;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The task cancelled after the checkpoint is due this long after the start:
/// 2023-11-14T23:13:20.000Z.
const TARGET_DELAY: Duration = Duration::from_secs(3600);
const TARGET_DUE: &str = "2023-11-14T23:13:20.000Z";

/// First deliveries fall due this long after the start; nacks retry this long after.
const DELAY: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(10);

fn config() -> Config {
    let mut c = Config::default();
    // The whole horizon resident: the tasks here due hours or days out stay
    // in the wheel (their payloads, not they, go to overflow files).
    c.resident_window = None;
    c.segment_bytes = kairos_wal::SEGMENT_BYTES_MIN;
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    c.durability = Durability::Sync;
    c.lease = kairos::config::LEASE_MAX;
    c.retry.max_attempts = 2;
    c.retry.backoff_jitter_percent = 0;
    c
}

/// The records of a log directory, by the log's own reading.
fn log_records(log_dir: &Path) -> TestResult<(kairos_wal::ScanReport, u64)> {
    let mut records = 0;
    let report = kairos_wal::scan(
        &FsStorage,
        log_dir,
        kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        &mut |_| records += 1,
    )?;
    Ok((report, records))
}

/// Flips one bit in the middle of `file`; returns the byte offset of the damage as the
/// checkpoint reader reports it.
fn flip_middle_bit(file: &Path) -> TestResult<u64> {
    let mut bytes = std::fs::read(file)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(file, &bytes)?;
    match kairos::checkpoint::read(&FsStorage, file) {
        Err(CheckpointReadError::Corrupt { offset, .. }) => {
            assert!(offset <= at as u64, "{offset} > {at}");
            Ok(offset)
        }
        other => Err(format!("the flipped checkpoint reads as {other:?}").into()),
    }
}

/// What [`build`] made.
struct Built {
    /// The engine's stats just before its shutdown.
    stats: Stats,
    /// The checkpoint: its LSN, live tasks, dead letters and size.
    lsn: u64,
    tasks: u64,
    dead_letters: u64,
    bytes: u64,
    /// Tasks by key.
    target: u64,
    held: u64,
    dead: u64,
    late_dead: u64,
}

/// Builds `dir`: `target` (due in an hour), 60 fillers a day out (every third cancelled),
/// `acked` delivered and acked, `dead` dead-lettered, `held` delivered and held by a
/// consumer; then a checkpoint (segments deleted); then `target` and two fillers
/// cancelled, a filler rescheduled, `late:*` scheduled (one cancelled) and `late-dead`
/// dead-lettered. `held` is still held at shutdown.
fn build(dir: &Path) -> TestResult<Built> {
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(dir, config(), &clock)?;
    let target = engine.schedule_after(b"target", TARGET_DELAY, b"t")?.0;
    for i in 0..60 {
        engine.schedule_after(
            format!("filler:{i}").as_bytes(),
            Duration::from_secs(86_400),
            &[b'f'; 100],
        )?;
    }
    for i in (0..60).step_by(3) {
        assert!(engine
            .cancel(format!("filler:{i}").as_bytes())?
            .is_cancelled());
    }
    let mut ids = HashMap::new();
    for key in ["acked", "held", "dead"] {
        ids.insert(key, engine.schedule_after(key.as_bytes(), DELAY, b"p")?.0);
    }
    let consumer = engine.consumer();
    clock.advance(DELAY);
    let mut held = None;
    for attempt in 1..=2 {
        for d in common::drain(&engine)? {
            match d.key() {
                b"acked" => consumer.ack(&d)?,
                b"held" => held = Some(d),
                b"dead" => {
                    let outcome = consumer.nack(&d, Some(RETRY), "boom")?;
                    assert_eq!(matches!(outcome, NackOutcome::DeadLettered), attempt == 2);
                }
                other => panic!("unexpected delivery {other:?}"),
            }
        }
        clock.advance(RETRY);
    }
    assert!(held.is_some());

    let report = engine.checkpoint()?;
    assert!(report.written && report.segments_removed > 0, "{report:?}");

    assert!(engine.cancel(b"target")?.is_cancelled());
    assert!(engine.cancel(b"filler:1")?.is_cancelled());
    assert!(engine.cancel(b"filler:2")?.is_cancelled());
    engine.reschedule(
        b"filler:4",
        kairos::Due::After(Duration::from_secs(7200)),
        None,
    )?;
    for i in 0..5 {
        engine.schedule_after(format!("late:{i}").as_bytes(), TARGET_DELAY, b"l")?;
    }
    assert!(engine.cancel(b"late:0")?.is_cancelled());
    let late_dead = engine.schedule_after(b"late-dead", DELAY, b"ld")?.0;
    clock.advance(DELAY);
    for _ in 1..=2 {
        for d in common::drain(&engine)? {
            assert_eq!(d.key(), b"late-dead");
            consumer.nack(&d, Some(RETRY), "late boom")?;
        }
        clock.advance(RETRY);
    }
    let stats = engine.stats();
    assert_eq!(
        (stats.ready, stats.in_flight, stats.dead_letters),
        (0, 1, 2),
        "{stats:?}"
    );
    engine.shutdown()?;
    drop(held);
    Ok(Built {
        stats,
        lsn: report.lsn,
        tasks: report.tasks,
        dead_letters: report.dead_letters,
        bytes: report.bytes,
        target,
        held: ids["held"],
        dead: ids["dead"],
        late_dead,
    })
}

/// Inspect's task counts against the engine's stats.
fn assert_counts(v: &Value, s: &Stats) {
    let t = &v["tasks"];
    assert_eq!(t["waiting"], s.scheduled + s.ready, "{t} vs {s:?}");
    assert_eq!(t["in_flight"], s.in_flight, "{t} vs {s:?}");
    assert_eq!(t["dead_letters"], s.dead_letters, "{t} vs {s:?}");
    assert_eq!(t["live"], s.pending, "{t} vs {s:?}");
}

#[test]
fn inspect_starts_from_the_checkpoint_and_counts_what_the_engine_said() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir)?;
    let ckpt = dir.join(CHECKPOINT_DIR_NAME).join(file_name(built.lsn));
    let (report, records) = log_records(&dir.join("wal"))?;
    let first_lsn = report.segments.first().ok_or("no segment")?.first_lsn.0;
    assert!(first_lsn > 1 && first_lsn <= built.lsn + 1, "{report:?}");

    let (stdout, _) = run(&["inspect", "--json", path(&dir)], 0);
    let v = json(&stdout);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["bad_records"], 0, "{v}");
    assert!(v["warnings"].as_array().is_some_and(Vec::is_empty), "{v}");
    assert_counts(&v, &built.stats);
    assert_eq!(v["records"], records);
    assert_eq!(v["first_lsn"], first_lsn);
    assert_eq!(v["last_lsn"], report.last_lsn.0);

    let c = &v["checkpoint"];
    assert_eq!(c["lsn"], built.lsn, "{c}");
    assert_eq!(c["file"].as_str().map(PathBuf::from), Some(ckpt.clone()));
    assert_eq!(c["bytes"], built.bytes);
    assert_eq!(c["bytes"], std::fs::metadata(&ckpt)?.len());
    assert_eq!(c["tasks"], built.tasks);
    assert_eq!(c["dead_letters"], built.dead_letters);
    assert_eq!(built.dead_letters, 1);
    let header = kairos::checkpoint::read_header(&FsStorage, &ckpt)?;
    assert_eq!(c["created_ms"], header.created_ms);
    assert_eq!(c["max_task_id"], header.max_task_id);
    let created = c["created"].as_str().ok_or("no created time")?;
    let created = humantime::parse_rfc3339(created)?;
    assert_eq!(
        created.duration_since(std::time::UNIX_EPOCH)?.as_millis(),
        u128::from(header.created_ms)
    );
    let files = v["checkpoint_files"].as_array().ok_or("no files")?;
    assert_eq!(files.len(), 1, "{v}");
    assert_eq!(files[0]["lsn"], built.lsn);
    assert_eq!(files[0]["bytes"], built.bytes);
    assert_eq!(v["checkpoint_tmp_files"], Value::Array(Vec::new()));

    // Live bytes per segment: the latest SCHEDULE or RESCHEDULE still in the log of each
    // task live at the end. A task whose schedule was deleted counts toward no segment.
    let (dump, _) = run(&["dump", "--json", path(&dir)], 0);
    let lines = json_lines(&dump);
    assert_eq!(lines[0]["type"], "CHECKPOINT");
    let mut latest: HashMap<u64, (String, u64)> = HashMap::new();
    for line in &lines[1..] {
        let id = line["task_id"].as_u64().ok_or("no task id")?;
        match line["type"].as_str().unwrap_or_default() {
            "SCHEDULE" | "RESCHEDULE" => {
                let file = line["file"].as_str().unwrap_or_default().to_string();
                let bytes = 5 + line["body_bytes"].as_u64().unwrap_or(0);
                latest.insert(id, (file, bytes));
            }
            "CANCEL" | "ACK" | "DEAD" => {
                latest.remove(&id);
            }
            _ => {}
        }
    }
    assert!(!latest.is_empty() && latest.len() < built.stats.pending);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (file, bytes) in latest.values() {
        *expected.entry(file.clone()).or_default() += bytes;
    }
    for seg in v["segments"].as_array().ok_or("no segments")? {
        let file = seg["file"].as_str().map(PathBuf::from).unwrap_or_default();
        let name = file
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert_eq!(
            seg["live_bytes"],
            expected.get(name).copied().unwrap_or(0),
            "{seg}"
        );
    }

    // Text.
    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    assert!(
        stdout.contains(&format!(
            "checkpoint      {} at LSN {}, created ",
            file_name(built.lsn),
            built.lsn
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{} bytes: {} live tasks, 1 dead letter",
            built.bytes, built.tasks
        )),
        "{stdout}"
    );
    let s = &built.stats;
    assert!(
        stdout.contains(&format!(
            "tasks           {} live: {} waiting, {} in flight (delivered, unsettled); 2 dead letters",
            s.pending,
            s.scheduled + s.ready,
            s.in_flight,
        )),
        "{stdout}"
    );
    assert!(stdout.ends_with("OK\n"), "{stdout}");

    // verify agrees.
    let (stdout, _) = run(&["verify", "--json", path(&dir)], 0);
    let w = json(&stdout);
    assert_eq!(w["ok"], true);
    assert_eq!(w["live_tasks"], s.pending);
    assert_eq!(w["dead_letters"], s.dead_letters);
    assert_eq!(w["checkpoint"]["lsn"], built.lsn);
    Ok(())
}

#[test]
fn dump_starts_with_the_checkpoint_and_keeps_one_tasks_history_whole() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir)?;
    let name = file_name(built.lsn);
    let (_, records) = log_records(&dir.join("wal"))?;

    let (stdout, stderr) = run(&["dump", path(&dir)], 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "checkpoint {name} at LSN {}: {} live tasks, 1 dead letter",
            built.lsn, built.tasks
        )
    );
    assert_eq!(lines.len() as u64, records + 1, "{stderr}");
    // The records still in the log, those at or below the checkpoint's LSN included.
    let lsns: Vec<u64> = lines[1..]
        .iter()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    assert_eq!(lsns.len() as u64, records);
    assert!(lsns.windows(2).all(|w| w[1] == w[0] + 1), "{lsns:?}");
    assert!(lsns[0] > 1 && lsns[0] <= built.lsn + 1, "{lsns:?}");

    let (stdout, _) = run(&["dump", "--json", path(&dir)], 0);
    let first = json_lines(&stdout).remove(0);
    assert_eq!(first["type"], "CHECKPOINT");
    assert_eq!(first["lsn"], built.lsn);
    assert_eq!(first["file"], name.as_str());
    assert_eq!(first["tasks"], built.tasks);
    assert_eq!(first["dead_letters"], 1);
    assert_eq!(first["bytes"], built.bytes);

    // A task scheduled before the checkpoint (its SCHEDULE deleted) and cancelled after:
    // the state the checkpoint holds, then the CANCEL.
    let (stdout, stderr) = run(&["dump", "--key", "target", path(&dir)], 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_eq!(
        lines[1],
        format!(
            "CHECKPOINT task={} key=\"target\" due={TARGET_DUE} deliveries=0 in_flight=false",
            built.target
        )
    );
    let cancel: Vec<&str> = lines[2].split(' ').collect();
    assert!(
        cancel[0].parse::<u64>().is_ok_and(|lsn| lsn > built.lsn),
        "{}",
        lines[2]
    );
    assert_eq!(cancel[2..], ["CANCEL", &format!("task={}", built.target)]);
    assert!(
        stderr.contains(&format!(
            "1 of {records} records shown: the history of task {} (key \"target\"); the \
             checkpoint at LSN {} holds the state of 1 of them",
            built.target, built.lsn
        )),
        "{stderr}"
    );
    let (stdout, _) = run(&["dump", "--json", "--key", "target", path(&dir)], 0);
    let lines = json_lines(&stdout);
    let types: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(types, ["CHECKPOINT", "CHECKPOINT_TASK", "CANCEL"]);
    assert_eq!(lines[1]["task_id"], built.target);
    assert_eq!(lines[1]["checkpoint_lsn"], built.lsn);
    assert_eq!(lines[1]["due"], TARGET_DUE);
    assert_eq!(lines[1]["in_flight"], false);
    assert_eq!(lines[2]["task_id"], built.target);

    // In flight at the checkpoint, nothing after it: its records at or below the
    // checkpoint's LSN still in the log (if its segment was the active one), then the state.
    let (stdout, _) = run(&["dump", "--key", "held", path(&dir)], 0);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("CHECKPOINT task={} key=\"held\" due=", built.held))
            && last.ends_with(" deliveries=1 in_flight=true"),
        "{stdout}"
    );
    assert_eq!(stdout.matches("CHECKPOINT task=").count(), 1, "{stdout}");
    below_the_checkpoint(&stdout, built.lsn, built.held)?;

    // A dead letter the checkpoint holds.
    let (stdout, _) = run(&["dump", "--key", "dead", path(&dir)], 0);
    assert_eq!(
        stdout.lines().last().unwrap_or_default(),
        format!(
            "DEAD_LETTER task={} key=\"dead\" due=2023-11-14T22:13:21.010Z deliveries=2 \
             dead=2023-11-14T22:13:21.010Z error=\"boom\"",
            built.dead
        )
    );
    below_the_checkpoint(&stdout, built.lsn, built.dead)?;

    // A task scheduled after the checkpoint: its records, as before.
    let (stdout, _) = run(&["dump", "--key", "late-dead", path(&dir)], 0);
    let types: Vec<&str> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split(' ').nth(2))
        .collect();
    assert_eq!(types, ["SCHEDULE", "DELIVER", "RETRY", "DELIVER", "DEAD"]);
    assert!(stdout
        .lines()
        .skip(1)
        .all(|l| l.contains(&format!("task={}", built.late_dead))));
    Ok(())
}

/// The lines of a `dump --key` between the checkpoint's line and the last line are records
/// of task `id` at or below the checkpoint's LSN, in LSN order.
fn below_the_checkpoint(stdout: &str, lsn: u64, id: u64) -> TestResult {
    let lines: Vec<&str> = stdout.lines().collect();
    let mut previous = 0;
    for line in &lines[1..lines.len() - 1] {
        let at: u64 = line.split(' ').next().unwrap_or_default().parse()?;
        assert!(at > previous && at <= lsn, "{stdout}");
        assert!(line.contains(&format!(" task={id}")), "{stdout}");
        previous = at;
    }
    Ok(())
}

#[test]
fn a_damaged_checkpoint_is_named_by_file_and_offset() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built_dir = tmp.path().join("built");
    let built = build(&built_dir)?;
    let name = file_name(built.lsn);
    let (_, records) = log_records(&built_dir.join("wal"))?;

    // The only checkpoint damaged: both commands fail, naming the file and the offset.
    let dir = tmp.path().join("flipped");
    copy_tree(&built_dir, &dir)?;
    let ckpt = dir.join(CHECKPOINT_DIR_NAME).join(&name);
    let offset = flip_middle_bit(&ckpt)?;
    let offset_line = format!("offset  {offset} (byte offset in the file)");

    let (stdout, _) = run(&["inspect", path(&dir)], 1);
    assert!(
        stdout.contains(&format!("file    {}", ckpt.display())),
        "{stdout}"
    );
    assert!(stdout.contains(&offset_line), "{stdout}");
    assert!(stdout.contains("FAILED: checkpoint"), "{stdout}");
    let (stdout, _) = run(&["inspect", "--json", path(&dir)], 1);
    let v = json(&stdout);
    assert_eq!(v["ok"], false);
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(ckpt.clone())
    );
    assert_eq!(v["error"]["offset"], offset);
    assert!(v["tasks"].is_null() && v["checkpoint"].is_null(), "{v}");
    assert_eq!(v["checkpoint_files"][0]["lsn"], built.lsn);

    // dump goes on with the log, without the checkpoint.
    let (stdout, stderr) = run(&["dump", path(&dir)], 1);
    assert_eq!(stdout.lines().count() as u64, records, "{stdout}");
    assert!(
        stderr.contains(&format!("file    {}", ckpt.display())),
        "{stderr}"
    );
    assert!(stderr.contains(&offset_line), "{stderr}");
    let (stdout, _) = run(&["dump", "--key", "late-dead", path(&dir)], 1);
    assert_eq!(stdout.lines().count(), 5, "{stdout}");

    // verify and the engine agree.
    let (stdout, _) = run(&["verify", path(&dir)], 1);
    assert!(stdout.contains(&offset_line), "{stdout}");
    assert!(Engine::open(&dir, config()).is_err());

    // An older checkpoint that reads but that the log does not cover (the records after
    // it are gone): the newest one's damage is the error, as at open.
    let mut header = kairos::checkpoint::read_header(
        &FsStorage,
        &built_dir.join(CHECKPOINT_DIR_NAME).join(&name),
    )?;
    header.lsn = 5;
    let older = kairos::checkpoint::CheckpointEncoder::new(&header).finish();
    std::fs::write(dir.join(CHECKPOINT_DIR_NAME).join(file_name(5)), older)?;
    let (stdout, _) = run(&["inspect", "--json", path(&dir)], 1);
    let v = json(&stdout);
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(ckpt.clone())
    );
    assert_eq!(v["error"]["offset"], offset);
    assert_eq!(v["checkpoint"]["lsn"], 5);
    let (_, stderr) = run(&["dump", path(&dir)], 1);
    assert!(stderr.contains(&offset_line), "{stderr}");
    let (stdout, _) = run(&["verify", path(&dir)], 1);
    assert!(stdout.contains(&offset_line), "{stdout}");
    // The engine refuses it too (naming the first record above the older checkpoint
    // that does not replay on its state, before it compares the log with it).
    assert!(Engine::open(&dir, config()).is_err());
    Ok(())
}

#[test]
fn an_older_checkpoint_the_log_covers_is_used_and_the_newer_damage_is_a_warning() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir)?;
    let ckpt_dir = dir.join(CHECKPOINT_DIR_NAME);
    // A newer checkpoint damaged, beside the older one: as a crash leaves them if it
    // comes after the new file is written and before the old one and the segments it
    // covers are removed (and the new file is then damaged). Its LSN is that of a record
    // the log holds; its bytes, a damaged copy of the older one's (they fail to read
    // before the LSN of the header is compared with the name's).
    let newer_lsn = built.lsn + 3;
    let newer = ckpt_dir.join(file_name(newer_lsn));
    std::fs::copy(ckpt_dir.join(file_name(built.lsn)), &newer)?;
    let offset = flip_middle_bit(&newer)?;
    std::fs::write(ckpt_dir.join("00000000000000ff.ckpt.tmp"), b"0123456789")?;
    let stats = built.stats;

    let (stdout, _) = run(&["inspect", "--json", path(&dir)], 0);
    let v = json(&stdout);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["checkpoint"]["lsn"], built.lsn);
    assert_counts(&v, &stats);
    let w = &v["warnings"][0];
    assert_eq!(w["file"].as_str().map(PathBuf::from), Some(newer.clone()));
    assert_eq!(w["offset"], offset);
    let lsns: Vec<&Value> = v["checkpoint_files"]
        .as_array()
        .ok_or("no files")?
        .iter()
        .map(|f| &f["lsn"])
        .collect();
    assert_eq!(lsns, [built.lsn, newer_lsn]);
    let tmps = &v["checkpoint_tmp_files"];
    assert_eq!(tmps.as_array().map(Vec::len), Some(1), "{tmps}");
    assert_eq!(tmps[0]["bytes"], 10);
    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    assert!(stdout.contains("WARNING: checkpoint"), "{stdout}");
    assert!(stdout.contains(&format!("offset  {offset}")), "{stdout}");
    assert!(
        stdout.contains("00000000000000ff.ckpt.tmp 10 bytes (a checkpoint"),
        "{stdout}"
    );

    let (stdout, stderr) = run(&["dump", path(&dir)], 0);
    assert!(
        stdout.starts_with(&format!("checkpoint {} at LSN", file_name(built.lsn))),
        "{stdout}"
    );
    assert!(stderr.contains("kairos dump: warning"), "{stderr}");
    assert!(stderr.contains(&format!("offset  {offset}")), "{stderr}");

    let (stdout, _) = run(&["verify", path(&dir)], 0);
    assert!(stdout.contains("WARNING: checkpoint"), "{stdout}");

    // The tools that open the engine say so on stderr (they used to say nothing).
    let (_, stderr) = run(&["dead-letters", "list", path(&dir)], 0);
    assert!(
        stderr.contains("WARNING: the newest checkpoint was passed over"),
        "{stderr}"
    );
    assert!(stderr.contains(&newer.display().to_string()), "{stderr}");

    // The engine opens from the older one too, to the same state, and says which it
    // passed over.
    let engine = Engine::open(&dir, config())?;
    assert_eq!(engine.stats().pending, stats.pending);
    let skipped = engine.recovery().skipped_checkpoint.clone();
    assert!(
        skipped
            .as_deref()
            .is_some_and(|s| s.contains(&newer.display().to_string())),
        "{skipped:?}"
    );
    engine.shutdown()?;
    Ok(())
}
