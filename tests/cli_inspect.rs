//! End-to-end tests of `kairos dump DIR` and `kairos inspect DIR`: a data directory is
//! built through the library (real file system, manual clock, a consumer that acks, nacks
//! and holds deliveries; schedule, cancel, reschedule, dead letter, requeue), then the
//! binary's output is checked value by value against what the engine said and what the
//! log holds. Damaged directories (a flipped byte, a cut segment, a torn tail, bodies that
//! do not decode, and a sample of the corruption matrix's images) must give exit status 1
//! naming the file and byte offset of the damage — or 0 for a torn tail — and never panic.

#![cfg(feature = "cli")]

mod common;

#[path = "../wal/tests/matrix_images/mod.rs"]
mod matrix_images;

use common::cli::{json, json_lines, path, run, text, KAIROS};
use common::{open_fs, TestResult, START_MS};
use kairos::{Config, Due, Durability, ManualClock, NackOutcome, RescheduleOutcome, Stats};
use kairos_wal::{FsStorage, ScanReport, WalError};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

/// 2030-01-02T03:04:05.678Z, the due time of the task keyed `fixed`.
const FIXED_DUE_MS: u64 = 1_893_553_445_678;
const FIXED_DUE: &str = "2030-01-02T03:04:05.678Z";

/// First deliveries fall due this long after the start; nacks retry this long after.
const DELAY: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_millis(10);

/// A key and payload that need escaping.
const BINARY_KEY: &[u8] = b"bin:\xff\n";

/// The log's own reading of a log directory: its report or error, and the records visited.
fn scan(log_dir: &Path) -> (Result<ScanReport, WalError>, u64) {
    let mut records = 0;
    let report = kairos_wal::scan(
        &FsStorage,
        log_dir,
        kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        &mut |_| records += 1,
    );
    (report, records)
}

/// The log's segment files, oldest first.
fn segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir.join("wal"))
        .expect("a wal directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    files
}

fn name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// What [`build`] made.
struct Built {
    /// The engine's stats just before its shutdown.
    stats: Stats,
    /// The first task keyed `doomed` (dead-lettered, then requeued) and its requeued
    /// successor (rescheduled).
    doomed: (u64, u64),
    /// The task keyed `fixed`.
    fixed: u64,
}

/// Builds `dir` through the public API: 60 filler tasks a day out (every third
/// cancelled), `fixed` due at [`FIXED_DUE_MS`], `resched` rescheduled twice (new payload,
/// then payload kept), a binary key, `acked` delivered and acked, `held` delivered and
/// still held at shutdown, `dead` dead-lettered and kept, `doomed` dead-lettered, requeued
/// and the new task rescheduled. 4 KiB segments, so the log spans several.
fn build(dir: &Path) -> TestResult<Built> {
    let clock = ManualClock::new(START_MS);
    let mut config: Config = common::config(Durability::Sync);
    config.retry.max_attempts = 2;
    config.retry.backoff_jitter_percent = 0;
    let engine = open_fs(dir, config, &clock)?;
    for i in 0..60 {
        let payload = vec![b'f'; 100];
        engine.schedule_after(
            format!("filler:{i}").as_bytes(),
            Duration::from_secs(86_400),
            &payload,
        )?;
    }
    for i in (0..60).step_by(3) {
        let _ = engine.cancel(format!("filler:{i}").as_bytes())?;
    }
    let at = UNIX_EPOCH + Duration::from_millis(FIXED_DUE_MS);
    let fixed = engine.schedule(b"fixed", Due::At(at), b"fixed payload")?.0;
    engine.schedule_after(b"resched", Duration::from_secs(3600), b"first")?;
    engine.reschedule(
        b"resched",
        Due::After(Duration::from_secs(7200)),
        Some(b"second"),
    )?;
    engine.reschedule(b"resched", Due::After(Duration::from_secs(10_800)), None)?;
    let mut binary_payload = b"\x00\x1b[31m".to_vec();
    binary_payload.extend(std::iter::repeat_n(b'x', 200));
    engine.schedule_after(BINARY_KEY, Duration::from_secs(3600), &binary_payload)?;
    for key in ["doomed", "acked", "held", "dead"] {
        engine.schedule_after(key.as_bytes(), DELAY, key.as_bytes())?;
    }

    let consumer = engine.consumer();
    clock.advance(DELAY);
    let mut held = None;
    let mut doomed_id = 0;
    for attempt in 1..=2 {
        let mut deliveries = common::drain(&engine)?;
        deliveries.sort_by_key(|d| d.key().to_vec());
        let keys: Vec<&[u8]> = deliveries.iter().map(|d| d.key()).collect();
        let expected: &[&[u8]] = if attempt == 1 {
            &[b"acked", b"dead", b"doomed", b"held"]
        } else {
            &[b"dead", b"doomed"]
        };
        assert_eq!(keys, expected, "attempt {attempt}");
        for d in deliveries {
            match d.key() {
                b"acked" => consumer.ack(&d)?,
                b"held" => held = Some(d),
                _ => {
                    if d.key() == b"doomed" {
                        doomed_id = d.task_id().0;
                    }
                    let outcome = consumer.nack(&d, Some(RETRY), "boom")?;
                    assert_eq!(
                        matches!(outcome, NackOutcome::DeadLettered),
                        attempt == 2,
                        "{outcome:?}"
                    );
                }
            }
        }
        clock.advance(RETRY);
    }
    let requeued = engine
        .requeue_dead_letter(
            kairos::TaskId(doomed_id),
            Due::After(Duration::from_secs(3600)),
        )?
        .0;
    let outcome = engine.reschedule(
        b"doomed",
        Due::After(Duration::from_secs(7200)),
        Some(b"second life"),
    )?;
    assert_eq!(
        outcome,
        RescheduleOutcome::Rescheduled(kairos::TaskId(requeued))
    );
    let stats = engine.stats();
    assert_eq!(
        (stats.ready, stats.in_flight, stats.dead_letters),
        (0, 1, 1),
        "{stats:?}"
    );
    engine.shutdown()?;
    drop(held);
    Ok(Built {
        stats,
        doomed: (doomed_id, requeued),
        fixed,
    })
}

#[test]
fn dump_prints_every_record_and_one_tasks_history() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir)?;
    let (report, records) = scan(&dir.join("wal"));
    let report = report?;
    assert!(report.segments.len() >= 3, "{report:?}");

    // Text: one line per record, in LSN order, each naming its segment and type.
    let (stdout, stderr) = run(&["dump", path(&dir)], 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len() as u64, records, "{stderr}");
    assert_eq!(records, report.records);
    for (i, line) in lines.iter().enumerate() {
        let mut fields = line.split(' ');
        assert_eq!(fields.next(), Some((i + 1).to_string().as_str()), "{line}");
        let place = fields.next().unwrap_or_default();
        assert!(place.contains(".seg:"), "{line}");
    }
    assert!(stderr.contains(&format!("{records} records")), "{stderr}");
    assert!(stderr.contains("clean shutdown: yes"), "{stderr}");
    let fixed_line = lines
        .iter()
        .find(|l| l.contains("key=\"fixed\""))
        .ok_or("no fixed line")?;
    assert!(
        fixed_line.contains(&format!(
            "SCHEDULE task={} due={FIXED_DUE} key=\"fixed\" payload=\"fixed payload\" payload_bytes=13",
            built.fixed
        )),
        "{fixed_line}"
    );
    // Escaped key and payload, cut to 64 bytes.
    let binary = lines
        .iter()
        .find(|l| l.contains("key=\"bin:"))
        .ok_or("no binary line")?;
    let shown = format!("\"\\0\\u{{1b}}[31m{}\"...", "x".repeat(58));
    assert!(
        binary.contains(&format!(
            "key=\"bin:\\xff\\n\" payload={shown} payload_bytes=206"
        )),
        "{binary}"
    );
    assert!(
        !stdout.contains('\u{1b}'),
        "an escape character reached the terminal"
    );
    let (full, _) = run(&["dump", "--full-payload", path(&dir)], 0);
    assert!(full.contains(&format!(
        "\"\\0\\u{{1b}}[31m{}\" payload_bytes=206",
        "x".repeat(200)
    )));

    // Every record type the build wrote, each with its fields.
    for needle in [
        " CANCEL task=",
        " DELIVER task=",
        " ACK task=",
        " RETRY task=",
        " DEAD task=",
        " PURGE task=",
        " RESCHEDULE task=",
        " payload=kept",
    ] {
        assert!(stdout.contains(needle), "no {needle:?} in the dump");
    }
    assert!(stdout.contains("fired=2023-11-14T22:13:21.000Z"));
    assert!(stdout.contains("dead=2023-11-14T22:13:21.010Z error=\"boom\""));

    // --key: exactly the history of both tasks that had the key, in order.
    let (stdout, stderr) = run(&["dump", "--key", "doomed", path(&dir)], 0);
    let history: Vec<(u64, String)> = stdout
        .lines()
        .map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let task = fields
                .iter()
                .find_map(|f| f.strip_prefix("task="))
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            (task, fields.get(2).copied().unwrap_or_default().to_string())
        })
        .collect();
    let (a, b) = built.doomed;
    let expected: Vec<(u64, String)> = [
        (a, "SCHEDULE"),
        (a, "DELIVER"),
        (a, "RETRY"),
        (a, "DELIVER"),
        (a, "DEAD"),
        (a, "PURGE"),
        (b, "SCHEDULE"),
        (b, "RESCHEDULE"),
    ]
    .iter()
    .map(|&(t, k)| (t, k.to_string()))
    .collect();
    assert_eq!(history, expected, "{stdout}");
    assert!(
        stderr.contains(&format!(
            "8 of {records} records shown: the histories of tasks {a}, {b}"
        )),
        "{stderr}"
    );
    let lsns: Vec<u64> = stdout
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    assert!(lsns.windows(2).all(|w| w[0] < w[1]), "{lsns:?}");

    // A key that is not UTF-8, given as raw bytes.
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let args: Vec<OsString> = vec![
            "dump".into(),
            "--key".into(),
            OsStr::from_bytes(BINARY_KEY).to_owned(),
            dir.clone().into(),
        ];
        let (stdout, _) = run(&args, 0);
        assert_eq!(stdout.lines().count(), 1, "{stdout}");
        assert!(stdout.contains("key=\"bin:\\xff\\n\""));
    }

    // A key no task had: nothing shown, still a success.
    let (stdout, stderr) = run(&["dump", "--key", "nobody", path(&dir)], 0);
    assert!(stdout.is_empty());
    assert!(stderr.contains("no task had key \"nobody\""), "{stderr}");
    Ok(())
}

#[test]
fn dump_json_lines_carry_raw_times_and_rfc3339() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir)?;
    let (_, records) = scan(&dir.join("wal"));
    let (stdout, _) = run(&["dump", "--json", path(&dir)], 0);
    let lines = json_lines(&stdout);
    assert_eq!(lines.len() as u64, records);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["lsn"], i as u64 + 1, "{line}");
        assert!(
            line["file"].as_str().is_some_and(|f| f.ends_with(".seg")),
            "{line}"
        );
        assert!(
            line["offset"]
                .as_u64()
                .is_some_and(|o| o > line["frame_offset"].as_u64().unwrap_or(u64::MAX)),
            "{line}"
        );
        assert!(
            line["type"].is_string() && line["task_id"].is_u64(),
            "{line}"
        );
    }
    let fixed = lines
        .iter()
        .find(|l| l["key"] == "fixed")
        .ok_or("no fixed record")?;
    assert_eq!(fixed["type"], "SCHEDULE");
    assert_eq!(fixed["record_type"], 1);
    assert_eq!(fixed["task_id"], built.fixed);
    assert_eq!(fixed["due_ms"], FIXED_DUE_MS);
    assert_eq!(fixed["due"], FIXED_DUE);
    assert_eq!(fixed["payload"], "fixed payload");
    assert_eq!(fixed["payload_bytes"], 13);
    assert_eq!(fixed["payload_truncated"], false);
    assert_eq!(fixed["body_bytes"], 22 + 5 + 13);

    let (a, _) = built.doomed;
    let dead = lines
        .iter()
        .find(|l| l["type"] == "DEAD" && l["task_id"] == a)
        .ok_or("no DEAD record")?;
    assert_eq!(dead["dead_ms"], START_MS + 1_010);
    assert_eq!(dead["dead"], "2023-11-14T22:13:21.010Z");
    assert_eq!(dead["error"], "boom");
    let deliver = lines
        .iter()
        .find(|l| l["type"] == "DELIVER")
        .ok_or("no DELIVER record")?;
    assert_eq!(deliver["fired_ms"], START_MS + 1_000);
    assert_eq!(deliver["fired"], "2023-11-14T22:13:21.000Z");
    let kept = lines
        .iter()
        .find(|l| l["type"] == "RESCHEDULE" && l["payload_kept"] == true)
        .ok_or("no RESCHEDULE keeping its payload")?;
    assert!(
        kept["payload"].is_null() && kept["due"].is_string(),
        "{kept}"
    );
    let binary = lines
        .iter()
        .find(|l| l["payload_bytes"] == 206)
        .ok_or("no binary record")?;
    assert_eq!(binary["key"], "bin:\u{fffd}\n");
    assert_eq!(binary["payload_truncated"], true);
    assert_eq!(binary["payload"].as_str().map(str::len), Some(64));

    // --key with --json: the same history as text.
    let (stdout, _) = run(&["dump", "--json", "--key", "doomed", path(&dir)], 0);
    let types: Vec<String> = json_lines(&stdout)
        .iter()
        .map(|l| l["type"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        types,
        [
            "SCHEDULE",
            "DELIVER",
            "RETRY",
            "DELIVER",
            "DEAD",
            "PURGE",
            "SCHEDULE",
            "RESCHEDULE"
        ]
    );
    Ok(())
}

#[test]
fn inspect_counts_what_the_engine_said() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir)?;
    // Other parts, listed generically by top-level subdirectory: a leftover temporary
    // checkpoint (not a checkpoint: the whole log is replayed) and an overflow store.
    std::fs::create_dir_all(dir.join("checkpoint"))?;
    std::fs::write(dir.join("checkpoint/0000000000000001.ckpt.tmp"), [7u8; 123])?;
    std::fs::create_dir_all(dir.join("overflow/a"))?;
    std::fs::write(dir.join("overflow/a/b.bin"), b"1234567")?;
    let (report, records) = scan(&dir.join("wal"));
    let report = report?;

    let (stdout, _) = run(&["inspect", "--json", path(&dir)], 0);
    let v = json(&stdout);
    assert_eq!(v["ok"], true);
    assert!(v["error"].is_null());
    assert_eq!(v["records"], records);
    assert_eq!(v["first_lsn"], 1);
    assert_eq!(v["last_lsn"], report.last_lsn.0);
    assert_eq!(v["clean_shutdown"], true);
    // Closed cleanly: CLOSED records every LSN as durable.
    assert_eq!(v["durable_lsn"], report.last_lsn.0);
    assert_eq!(report.high_water_lsn, report.last_lsn);
    assert!(v["torn_tail"].is_null());
    assert!(v["checkpoint"].is_null(), "{v}");
    // No overflow file (`overflow/a/b.bin` is not one), and nothing refers to one.
    let o = &v["overflow"];
    assert_eq!(o["files"], Value::Array(Vec::new()), "{o}");
    assert_eq!(o["total"]["entries"], 0, "{o}");
    assert_eq!(v["tasks"]["payload_in_overflow"], 0, "{v}");
    assert_eq!(v["checkpoint_files"], Value::Array(Vec::new()));
    assert_eq!(v["checkpoint_tmp_files"][0]["bytes"], 123);

    // Pending tasks by state, as the engine counted them before its shutdown: the
    // shutdown took back nothing (no delivery was ready), and the delivery held by a
    // consumer stays in flight in the log until the next open settles it.
    let s = &built.stats;
    let t = &v["tasks"];
    assert_eq!(t["waiting"], s.scheduled + s.ready, "{t} vs {s:?}");
    assert_eq!(t["in_flight"], s.in_flight, "{t} vs {s:?}");
    assert_eq!(t["dead_letters"], s.dead_letters, "{t} vs {s:?}");
    assert_eq!(t["live"], s.pending, "{t} vs {s:?}");

    // Segments: the scan's, with their record counts adding up.
    let segs = v["segments"].as_array().ok_or("no segments")?;
    assert_eq!(segs.len(), report.segments.len());
    let mut sum = 0;
    for (seg, info) in segs.iter().zip(&report.segments) {
        assert_eq!(
            seg["file"].as_str().map(PathBuf::from),
            Some(info.file.clone())
        );
        assert_eq!(seg["bytes"], std::fs::metadata(&info.file)?.len());
        assert_eq!(seg["records"], info.records);
        assert_eq!(seg["first_lsn"], info.first_lsn.0);
        assert_eq!(seg["last_lsn"], info.last_lsn.0);
        assert_eq!(seg["sealed"], info.sealed);
        sum += info.records;
    }
    assert_eq!(sum, records);
    let types: u64 = v["record_types"]
        .as_array()
        .ok_or("no record types")?
        .iter()
        .map(|t| t["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(types, records);

    // Live bytes per segment, recomputed from the dump: for each task live at the end,
    // its latest SCHEDULE or RESCHEDULE record (5-byte header + body).
    let (dump, _) = run(&["dump", "--json", path(&dir)], 0);
    let mut latest: HashMap<u64, (String, u64)> = HashMap::new();
    for line in json_lines(&dump) {
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
    assert_eq!(latest.len(), s.pending);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for (file, bytes) in latest.values() {
        *expected.entry(file.clone()).or_default() += bytes;
    }
    for seg in segs {
        let file = seg["file"]
            .as_str()
            .map(|f| name(Path::new(f)))
            .unwrap_or_default();
        let live = expected.get(&file).copied().unwrap_or(0);
        assert_eq!(seg["live_bytes"], live, "{seg}");
        let fraction = seg["live_fraction"].as_f64().unwrap_or(-1.0);
        let size = seg["bytes"].as_f64().unwrap_or(0.0);
        assert!((fraction - live as f64 / size).abs() < 1e-9, "{seg}");
    }
    assert!(expected.values().sum::<u64>() > 0);

    // Disk usage: the log's files, and the other parts by top-level subdirectory.
    let disk = &v["disk"];
    let seg_bytes: u64 = segments(&dir)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum();
    assert_eq!(disk["wal_segment_bytes"], seg_bytes);
    assert_eq!(disk["wal_segment_files"], segments(&dir).len());
    let parts = disk["parts"].as_array().ok_or("no parts")?;
    let names: Vec<&str> = parts.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names, ["wal/", "checkpoint/", "overflow/", "."], "{disk}");
    let wal_bytes: u64 = std::fs::read_dir(dir.join("wal"))?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert_eq!(parts[0]["bytes"], wal_bytes);
    assert_eq!(parts[1]["bytes"], 123);
    assert_eq!(
        parts[1]["listed"][0]["path"],
        "checkpoint/0000000000000001.ckpt.tmp"
    );
    assert_eq!(parts[2]["bytes"], 7);
    assert_eq!(parts[2]["listed"][0]["path"], "overflow/a/b.bin");
    assert_eq!(disk["total_bytes"], wal_bytes + 123 + 7);

    // Text: the same figures.
    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    assert!(
        stdout.contains(&format!(
            "tasks           {} live: {} waiting, {} in flight (delivered, unsettled); 1 dead letter",
            s.pending,
            s.scheduled + s.ready,
            s.in_flight,
        )),
        "{stdout}"
    );
    assert!(stdout.contains("clean shutdown  yes"), "{stdout}");
    assert!(stdout.contains("torn tail       none"), "{stdout}");
    assert!(
        stdout.contains("checkpoint      none: the whole log is replayed"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "checkpoint/   123 bytes in 1 file: checkpoint/0000000000000001.ckpt.tmp 123"
        ),
        "{stdout}"
    );
    assert!(stdout.ends_with("OK\n"), "{stdout}");
    for seg in &report.segments {
        assert!(stdout.contains(&name(&seg.file)), "{stdout}");
    }

    // Pointed at the log directory itself (beside the engine's LOCK): read with its data
    // directory, the same.
    let (stdout, _) = run(&["inspect", "--json", path(&dir.join("wal"))], 0);
    let w = json(&stdout);
    assert_eq!(w["records"], records);
    assert_eq!(w["tasks"], v["tasks"]);
    assert_eq!(w["overflow"], v["overflow"], "{w}");
    assert_eq!(w["disk"], v["disk"], "{w}");
    // And by a relative path: the log's segments are still counted as the log's.
    let out = Command::new(KAIROS)
        .current_dir(&dir)
        .args(["inspect", "--json", "wal"])
        .output()?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&text(&out.stdout));
    assert_eq!(r["disk"], v["disk"], "{r}");
    assert!(v["disk"]["wal_segment_files"].as_u64() > Some(0), "{v}");
    Ok(())
}

/// Copies the files (not subdirectories) of `from` into a new directory `to`.
fn copy_dir(from: &Path, to: &Path) -> TestResult {
    std::fs::create_dir_all(to.join("wal"))?;
    for entry in std::fs::read_dir(from.join("wal"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join("wal").join(entry.file_name()))?;
    }
    Ok(())
}

/// Checks both commands on a damaged directory against the log's own verdict: exit 1
/// naming the file and offset of a corruption, the records before it dumped; exit 0 and
/// a mention of the torn tail otherwise.
fn check_damaged(dir: &Path, expect_corrupt: bool) -> TestResult {
    let (report, records) = scan(&dir.join("wal"));
    let (dump_status, inspect_status) = if report.is_ok() { (0, 0) } else { (1, 1) };
    let (stdout, stderr) = run(&["dump", path(dir)], dump_status);
    assert_eq!(stdout.lines().count() as u64, records, "{stderr}");
    let (json_out, _) = run(&["dump", "--json", path(dir)], dump_status);
    assert_eq!(json_lines(&json_out).len() as u64, records);
    let (inspect, _) = run(&["inspect", path(dir)], inspect_status);
    let (inspect_json, _) = run(&["inspect", "--json", path(dir)], inspect_status);
    let v = json(&inspect_json);
    assert_eq!(v["records"], records, "{inspect_json}");
    match report {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert!(
                expect_corrupt,
                "unexpected corruption in {}",
                file.display()
            );
            for out in [&stderr, &inspect] {
                assert!(out.contains(&name(&file)), "no file in {out}");
                assert!(
                    out.contains(&format!("offset  {offset}")),
                    "no offset {offset} in {out}"
                );
            }
            assert!(inspect.contains("FAILED: corrupt log"), "{inspect}");
            assert_eq!(v["ok"], false);
            assert_eq!(v["error"]["file"].as_str().map(PathBuf::from), Some(file));
            assert_eq!(v["error"]["offset"], offset);
        }
        Err(e) => {
            assert!(expect_corrupt, "unexpected error {e}");
            assert_eq!(v["ok"], false);
            assert!(v["error"]["message"].is_string());
        }
        Ok(report) => {
            assert!(!expect_corrupt, "no corruption found");
            assert_eq!(v["ok"], true);
            if let Some(torn) = &report.torn_tail {
                assert!(stderr.contains("torn tail"), "{stderr}");
                assert!(stderr.contains(&name(&torn.file)), "{stderr}");
                assert!(inspect.contains("torn tail       yes"), "{inspect}");
                assert_eq!(v["torn_tail"]["offset"], torn.offset);
                assert_eq!(v["torn_tail"]["first_lost_lsn"], torn.first_lost_lsn.0);
            }
        }
    }
    Ok(())
}

#[test]
fn damaged_and_torn_directories() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    let segs = segments(&built);
    let sealed = name(&segs[1]);

    // A flipped byte in the middle of a sealed segment.
    let flipped = tmp.path().join("flipped");
    copy_dir(&built, &flipped)?;
    let file = flipped.join("wal").join(&sealed);
    let mut bytes = std::fs::read(&file)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5A;
    std::fs::write(&file, &bytes)?;
    check_damaged(&flipped, true)?;
    let (v, _) = run(&["inspect", "--json", path(&flipped)], 1);
    let v = json(&v);
    assert!(v["error"]["offset"]
        .as_u64()
        .is_some_and(|o| o <= at as u64));
    assert!(v["records"].as_u64().is_some_and(|r| r > 0));

    // A sealed segment cut short.
    let cut = tmp.path().join("cut");
    copy_dir(&built, &cut)?;
    let file = cut.join("wal").join(&sealed);
    let len = std::fs::metadata(&file)?.len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file)?
        .set_len(len * 2 / 3)?;
    check_damaged(&cut, true)?;

    // The newest segment's CLOSE frame cut short: a torn tail, not damage.
    let torn = tmp.path().join("torn");
    copy_dir(&built, &torn)?;
    let newest = torn
        .join("wal")
        .join(name(segs.last().ok_or("no segment")?));
    let len = std::fs::metadata(&newest)?.len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)?
        .set_len(len - 20)?;
    let (report, _) = scan(&torn.join("wal"));
    assert!(report?.torn_tail.is_some());
    check_damaged(&torn, false)?;
    let (inspect, _) = run(&["inspect", path(&torn)], 0);
    assert!(inspect.contains("clean shutdown  no"), "{inspect}");
    // CLOSED still records the close before the cut: the cut CLOSE frame is above it.
    let durable = scan(&torn.join("wal")).0?.high_water_lsn.0;
    assert!(durable > 0);
    assert!(
        inspect.contains(&format!("known durable   up to LSN {durable} ")),
        "{inspect}"
    );
    Ok(())
}

#[test]
fn bodies_that_do_not_decode_are_shown_and_fail() -> TestResult {
    // A log written directly: a valid schedule, a schedule body too short, an unknown type.
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("wal");
    let (wal, _) = kairos_wal::Wal::open(
        std::sync::Arc::new(FsStorage),
        &wal_dir,
        kairos_wal::WalOptions::default(),
        &mut |_| Ok(()),
    )?;
    let mut schedule = Vec::new();
    schedule.extend_from_slice(&1u64.to_le_bytes());
    schedule.extend_from_slice(&u64::MAX.to_le_bytes());
    schedule.extend_from_slice(&1u16.to_le_bytes());
    schedule.extend_from_slice(&0u32.to_le_bytes());
    schedule.push(b'k');
    let records = [
        kairos_wal::Record {
            record_type: 1,
            body: &schedule,
        },
        kairos_wal::Record {
            record_type: 1,
            body: b"short",
        },
        kairos_wal::Record {
            record_type: 42,
            body: b"xyz",
        },
    ];
    wal.append(&records)?.wait()?;
    wal.close()?;

    let (stdout, stderr) = run(&["dump", path(tmp.path())], 1);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    // A due time past the year 9999 is printed raw.
    assert!(
        lines[0].ends_with(
            "SCHEDULE task=1 due_ms=18446744073709551615 key=\"k\" payload=\"\" payload_bytes=0"
        ),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(" SCHEDULE body_bytes=5 undecodable: bad schedule record:"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains(" UNKNOWN(42) body_bytes=3 undecodable:"),
        "{}",
        lines[2]
    );
    assert!(
        stderr.contains("2 record bodies do not decode (the first at LSN 2)"),
        "{stderr}"
    );

    let (stdout, _) = run(&["dump", "--json", path(tmp.path())], 1);
    let lines = json_lines(&stdout);
    assert_eq!(lines[0]["due_ms"], u64::MAX);
    assert!(lines[0]["due"].is_null() && lines[0].get("due").is_some());
    assert_eq!(lines[1]["type"], "SCHEDULE");
    assert_eq!(lines[1]["body_bytes"], 5);
    assert!(lines[1]["decode_error"].is_string());
    assert_eq!(lines[2]["type"], "UNKNOWN(42)");
    assert_eq!(lines[2]["record_type"], 42);

    let (stdout, _) = run(&["inspect", "--json", path(tmp.path())], 1);
    let v = json(&stdout);
    assert_eq!(v["bad_records"], 2);
    assert_eq!(v["bad_record_details"][0]["lsn"], 2);
    assert_eq!(v["tasks"]["waiting"], 1);
    let (stdout, _) = run(&["inspect", path(tmp.path())], 1);
    assert!(
        stdout.contains("BAD RECORD: LSN 3 (UNKNOWN(42))"),
        "{stdout}"
    );
    Ok(())
}

/// Records whose bodies decode but which break the engine's replay rules (a cancel of a task
/// never scheduled, an ack of a task not delivered): the engine refuses to open the directory
/// and `verify` and `inspect` fail, and `dump` — which only decoded the bodies, and exited 0
/// — now replays them too and fails, naming the first by LSN, file and byte offset.
#[test]
fn records_that_break_the_replay_rules_fail_dump_as_they_fail_verify() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let wal_dir = tmp.path().join("wal");
    let (wal, _) = kairos_wal::Wal::open(
        std::sync::Arc::new(FsStorage),
        &wal_dir,
        kairos_wal::WalOptions::default(),
        &mut |_| Ok(()),
    )?;
    let mut schedule = Vec::new();
    schedule.extend_from_slice(&1u64.to_le_bytes());
    schedule.extend_from_slice(&2_000_000_000_000u64.to_le_bytes());
    schedule.extend_from_slice(&1u16.to_le_bytes());
    schedule.extend_from_slice(&0u32.to_le_bytes());
    schedule.push(b'k');
    let records = [
        kairos_wal::Record {
            record_type: 1,
            body: &schedule,
        },
        kairos_wal::Record {
            record_type: 2,
            body: &999u64.to_le_bytes(),
        },
        kairos_wal::Record {
            record_type: 4,
            body: &1u64.to_le_bytes(),
        },
    ];
    wal.append(&records)?.wait()?;
    wal.close()?;
    let d = path(tmp.path());
    run(&["verify", d], 1);
    run(&["inspect", d], 1);
    for args in [
        &["dump", d][..],
        &["dump", "--json", d],
        &["dump", "--key", "k", d],
    ] {
        let (stdout, stderr) = run(args, 1);
        // Every record is still printed (but with --key, only task 1's).
        let shown = if args.contains(&"--key") { 2 } else { 3 };
        assert_eq!(stdout.lines().count(), shown, "{args:?}: {stdout}");
        assert!(
            stderr.contains(
                "FAILED: 2 records break the engine's replay rules, the first at LSN 2: cancel \
                 record for task 999"
            ),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("  offset  "), "{args:?}: {stderr}");
    }
    assert!(kairos::Engine::open(tmp.path(), Config::default()).is_err());
    Ok(())
}

/// Writes a matrix case under `root/wal/`.
fn write_case(case: &matrix_images::Case, root: &Path) -> TestResult {
    let wal = root.join("wal");
    std::fs::create_dir_all(&wal)?;
    for (path, bytes) in &case.files {
        if let Some(name) = path.file_name() {
            std::fs::write(wal.join(name), bytes)?;
        }
    }
    Ok(())
}

#[test]
fn a_sample_of_the_corruption_matrix_never_panics_and_agrees_with_the_log() -> TestResult {
    let images = [
        matrix_images::closed_image(21, 110)?,
        matrix_images::crashed_image(22, 90, 110)?,
    ];
    let mut cases = Vec::new();
    for image in &images {
        let mut n = 0;
        matrix_images::for_each_bit_flip(image, &[3], |case| {
            n += 1;
            if n % 211 == 0 {
                cases.push(case);
            }
        });
        let mut n = 0;
        matrix_images::for_each_truncation(image, |case| {
            n += 1;
            if n % 307 == 0 && case.name.contains(".seg") {
                cases.push(case);
            }
        });
    }
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let (mut refused, mut opened) = (0, 0);
    for (i, case) in cases.iter().enumerate() {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path().join(format!("case{i}"));
        write_case(case, &root)?;
        let (report, _) = scan(&root.join("wal"));
        if report.is_ok() {
            opened += 1;
        } else {
            refused += 1;
        }
        check_damaged(&root, report.is_err()).map_err(|e| format!("{case}: {e}"))?;
    }
    assert!(
        refused > 0 && opened > 0,
        "{refused} refused, {opened} opened"
    );
    Ok(())
}

#[test]
fn bad_usage_and_unreadable_directories() {
    run(&["dump"], 2);
    run(&["inspect"], 2);
    run(&["inspect", "--bogus", "/tmp"], 2);
    let tmp = tempfile::tempdir().expect("a temporary directory");
    let (_, stderr) = run(&["dump", path(tmp.path())], 1);
    assert!(stderr.contains("no log segments"), "{stderr}");
    let (stdout, _) = run(&["inspect", path(tmp.path())], 1);
    assert!(stdout.contains("no log segments"), "{stdout}");
    let missing = tmp.path().join("missing");
    run(&["dump", path(&missing)], 1);
    run(&["inspect", "--json", path(&missing)], 1);
    for args in [&["dump", "--help"][..], &["inspect", "--help"]] {
        let (stdout, _) = run(args, 0);
        assert!(stdout.contains("Exit status"), "{stdout}");
    }
}

#[test]
fn dump_into_a_closed_pipe_ends_quietly() -> TestResult {
    use std::io::Read;
    // Enough output (about 600 KiB) to outlast the pipe's buffer.
    let tmp = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(tmp.path(), common::config(Durability::Buffered), &clock)?;
    let payload = vec![b'\x01'; 1000];
    let keys: Vec<String> = (0..150).map(|i| format!("k{i}")).collect();
    let tasks: Vec<kairos::NewTask<'_>> = keys
        .iter()
        .map(|k| kairos::NewTask {
            key: k.as_bytes(),
            due: Due::After(Duration::from_secs(60)),
            payload: &payload,
        })
        .collect();
    engine.schedule_many(&tasks)?;
    engine.shutdown()?;
    let mut child = Command::new(KAIROS)
        .args(["dump", "--full-payload", path(tmp.path())])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?;
    let mut first = [0u8; 100];
    stdout.read_exact(&mut first)?;
    drop(stdout);
    let out = child.wait_with_output()?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("panicked"));
    Ok(())
}

/// `dump --json` shows keys and payloads as UTF-8 lossily; bytes that are not valid UTF-8 also
/// come exactly, in hex (`key_hex`, `payload_hex`), in record lines and in `--key` state lines;
/// valid UTF-8 gets no hex field.
#[test]
fn dump_json_gives_bytes_that_are_not_utf8_in_hex() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let engine = kairos::Engine::open(&dir, Config::default())?;
    engine.schedule_after(b"k\xff", Duration::from_secs(60), b"\x00\xfe")?;
    engine.schedule_after(b"plain", Duration::from_secs(60), "é".as_bytes())?;
    engine.checkpoint()?;
    engine.shutdown()?;
    let (stdout, _) = run(&["dump".as_ref(), "--json".as_ref(), dir.as_os_str()], 0);
    let lines = json_lines(&stdout);
    let schedules: Vec<&Value> = lines.iter().filter(|l| l["type"] == "SCHEDULE").collect();
    assert_eq!(schedules.len(), 2, "{stdout}");
    assert_eq!(schedules[0]["key"], "k\u{fffd}");
    assert_eq!(schedules[0]["key_hex"], "6bff");
    assert_eq!(schedules[0]["payload_hex"], "00fe");
    assert_eq!(schedules[1]["key"], "plain");
    assert_eq!(schedules[1]["payload"], "é");
    assert!(schedules[1].get("key_hex").is_none(), "{}", schedules[1]);
    assert!(
        schedules[1].get("payload_hex").is_none(),
        "{}",
        schedules[1]
    );
    // The checkpoint's state line for the key (given as raw bytes on the command line).
    use std::os::unix::ffi::OsStrExt;
    let key = OsStr::from_bytes(b"k\xff");
    let (stdout, _) = run(
        &[
            "dump".as_ref(),
            "--json".as_ref(),
            "--key".as_ref(),
            key,
            dir.as_os_str(),
        ],
        0,
    );
    let state: Vec<Value> = json_lines(&stdout)
        .into_iter()
        .filter(|l| l["type"] != "SCHEDULE" && l["type"] != "CHECKPOINT")
        .collect();
    assert_eq!(state.len(), 1, "{stdout}");
    assert_eq!(state[0]["key_hex"], "6bff", "{}", state[0]);
    Ok(())
}
