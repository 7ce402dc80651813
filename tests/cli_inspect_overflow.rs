//! `kairos inspect` on a directory whose payloads moved to overflow files: a directory is
//! built through the library (real file system, manual clock, a one-minute payload window, no
//! prefetch, no background checkpoints) with two checkpoints, each moving the payloads of the
//! tasks due in hours or days to a new overflow file; then some of those tasks fire, are
//! cancelled or rescheduled (one with a new payload, one without). Inspect must count, per
//! file, the entries and exactly the live ones (those a live task still refers to), give the
//! due range of its entries, split the live tasks by where their payload is, list orphans and
//! leftover temporary files, and name a damaged file by file and byte offset (exit 1).

#![cfg(feature = "cli")]

mod common;

use common::cli::{copy_tree, json, path, run};
use common::{open_fs, TestResult, START_MS};
use kairos::overflow::{self, OverflowReadError, OVERFLOW_DIR_NAME};
use kairos::{Config, Due, Engine, ManualClock};
use kairos_wal::FsStorage;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

fn inspect_json(dir: &Path, status: i32) -> Value {
    json(&run(&["inspect", "--json", path(dir)], status).0)
}

fn config() -> Config {
    let mut c = Config::default();
    // The whole horizon resident: the tasks here due hours or days out stay
    // in the wheel (their payloads, not they, go to overflow files).
    c.resident_window = None;
    c.payload_window = Some(Duration::from_secs(60));
    c.payload_prefetch = false;
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    c
}

/// RFC 3339 of the start plus `after`.
fn due(after: Duration) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(START_MS) + after;
    humantime::format_rfc3339_millis(at).to_string()
}

fn ovf_path(dir: &Path, number: u32) -> PathBuf {
    dir.join(OVERFLOW_DIR_NAME)
        .join(overflow::file_name(number))
}

/// Builds `dir`:
/// - `a:0`..`a:9` due in 1..10 hours, `soon` due in 2 minutes, `near` in 30 s (within the
///   window); checkpoint 1 moves the first eleven payloads to overflow file 1;
/// - `b:0`..`b:4` due in 1..5 days; checkpoint 2 moves them to file 2 (file 1 is all live:
///   not compacted);
/// - the clock runs 2 minutes: `near` and `soon` fire and are acked (`soon`'s payload read
///   back from file 1);
/// - `a:1`, `a:2` and `b:0` are cancelled, `a:3` rescheduled with a new payload, `a:4`
///   without one.
///
/// Live at the end: `a:0`, `a:4`..`a:9` (payloads in file 1), `b:1`..`b:4` (file 2), and
/// `a:3`, whose payload is in memory.
fn build(dir: &Path) -> TestResult {
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(dir, config(), &clock)?;
    for i in 0..10u32 {
        engine.schedule_after(
            format!("a:{i}").as_bytes(),
            HOUR * (i + 1),
            format!("payload of a:{i}").as_bytes(),
        )?;
    }
    engine.schedule_after(b"soon", Duration::from_secs(120), b"soon payload")?;
    engine.schedule_after(b"near", Duration::from_secs(30), b"near payload")?;
    let report = engine.checkpoint()?;
    assert_eq!(report.payloads_moved, 11, "{report:?}");
    for i in 0..5u32 {
        engine.schedule_after(format!("b:{i}").as_bytes(), DAY * (i + 1), &[b'b'; 40])?;
    }
    let report = engine.checkpoint()?;
    assert_eq!(report.payloads_moved, 5, "{report:?}");
    assert_eq!(engine.stats().payloads_on_disk, 16);

    let fired = common::advance(&clock, &engine, Duration::from_secs(120))?;
    let consumer = engine.consumer();
    let mut keys = Vec::new();
    for d in &fired {
        keys.push(String::from_utf8_lossy(d.key()).into_owned());
        if d.key() == b"soon" {
            assert_eq!(d.payload(), b"soon payload");
        }
        consumer.ack(d)?;
    }
    keys.sort();
    assert_eq!(keys, ["near", "soon"]);

    for key in ["a:1", "a:2", "b:0"] {
        assert!(engine.cancel(key.as_bytes())?.is_cancelled());
    }
    engine.reschedule(b"a:3", Due::After(HOUR * 20), Some(b"new payload of a:3"))?;
    engine.reschedule(b"a:4", Due::After(HOUR * 30), None)?;
    let stats = engine.stats();
    assert_eq!(
        (stats.pending, stats.payloads_on_disk),
        (12, 11),
        "{stats:?}"
    );
    engine.shutdown()?;
    Ok(())
}

#[test]
fn inspect_counts_overflow_entries_live_and_dead() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir)?;
    let (file1, file2) = (ovf_path(&dir, 1), ovf_path(&dir, 2));

    let v = inspect_json(&dir, 0);
    assert_eq!(v["ok"], true, "{v}");
    assert!(v.get("horizon").is_none(), "{v}");
    let t = &v["tasks"];
    assert_eq!(t["live"], 12, "{t}");
    assert_eq!(t["payload_in_overflow"], 11, "{t}");
    assert_eq!(t["payload_in_memory"], 1, "{t}");
    // The second checkpoint: a:0..9, b:0..4, soon and near; all but near's payload on disk.
    assert_eq!(v["checkpoint"]["tasks"], 17, "{v}");
    assert_eq!(v["checkpoint"]["payloads_in_overflow"], 16, "{v}");

    let o = &v["overflow"];
    assert_eq!(
        o["dir"].as_str().map(PathBuf::from),
        Some(dir.join(OVERFLOW_DIR_NAME))
    );
    let files = o["files"].as_array().ok_or("no overflow files")?;
    assert_eq!(files.len(), 2, "{o}");
    let f1 = &files[0];
    assert_eq!(f1["file"].as_str().map(PathBuf::from), Some(file1.clone()));
    assert_eq!(f1["number"], 1);
    assert_eq!(f1["bytes"], std::fs::metadata(&file1)?.len());
    // soon, a:0..9; live: a:0 and a:4..9 (soon fired, a:1 and a:2 cancelled, a:3 has a new
    // payload; a:4's reschedule kept its payload).
    assert_eq!(f1["entries"], 11, "{f1}");
    assert_eq!(f1["live_entries"], 7, "{f1}");
    let dead = f1["dead_fraction"].as_f64().ok_or("no dead fraction")?;
    assert!((dead - 4.0 / 11.0).abs() < 1e-9, "{f1}");
    assert_eq!(f1["first_due"], due(Duration::from_secs(120)), "{f1}");
    assert_eq!(f1["last_due"], due(HOUR * 10), "{f1}");
    assert_eq!(f1["first_due"], "2023-11-14T22:15:20.000Z");
    assert_eq!(f1["first_due_ms"], START_MS + 120_000);
    assert_eq!(f1["orphan"], false);
    assert!(f1["damage"].is_null(), "{f1}");
    // Each entry: 30 bytes, the key, the payload ("payload of a:i": 14 bytes).
    assert_eq!(f1["live_bytes"], 7 * (30 + 3 + 14), "{f1}");

    let f2 = &files[1];
    assert_eq!(f2["file"].as_str().map(PathBuf::from), Some(file2.clone()));
    assert_eq!(f2["entries"], 5, "{f2}");
    assert_eq!(f2["live_entries"], 4, "{f2}");
    assert_eq!(f2["first_due"], due(DAY), "{f2}");
    assert_eq!(f2["last_due"], due(DAY * 5), "{f2}");
    assert_eq!(f2["live_bytes"], 4 * (30 + 3 + 40), "{f2}");

    let total = &o["total"];
    assert_eq!(total["files"], 2);
    assert_eq!(
        total["bytes"],
        std::fs::metadata(&file1)?.len() + std::fs::metadata(&file2)?.len()
    );
    assert_eq!(total["entries"], 16);
    assert_eq!(total["live_entries"], 11);
    assert_eq!(total["orphan_files"], 0);
    assert_eq!(total["damaged_files"], 0);
    assert_eq!(total["first_due"], due(Duration::from_secs(120)));
    assert_eq!(total["last_due"], due(DAY * 5));
    assert_eq!(o["tmp_files"], Value::Array(Vec::new()));

    // Text: the same figures.
    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    for line in [
        "payloads        1 in memory (in the checkpoint or logged after it), 11 in overflow files"
            .to_string(),
        format!(
            "overflow        2 files, {} bytes: 16 entries, 11 live (31.2% dead), due {}..{}",
            total["bytes"],
            due(Duration::from_secs(120)),
            due(DAY * 5)
        ),
        format!(
            "  0000000000000001.ovf  {} bytes, 11 entries, 7 live (36.4% dead), due {}..{}",
            f1["bytes"],
            due(Duration::from_secs(120)),
            due(HOUR * 10)
        ),
        "  payload window  unknown here".to_string(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in\n{stdout}");
    }
    assert!(stdout.ends_with("OK\n"), "{stdout}");

    // An orphan (a whole file no task refers to, as a checkpoint that never became durable
    // leaves it) and a leftover temporary file: reported, not damage; the next open removes
    // both.
    let with_orphan = tmp.path().join("orphan");
    copy_tree(&dir, &with_orphan)?;
    let header = std::fs::read(&file1)?;
    let mut store_id = [0u8; 16];
    store_id.copy_from_slice(&header[16..32]);
    let mut writer = overflow::OverflowWriter::new(&store_id, 3);
    writer.push(99, START_MS + 7 * DAY.as_millis() as u64, b"gone", b"x");
    let bytes = writer.finish();
    let orphan = ovf_path(&with_orphan, 3);
    std::fs::write(&orphan, &bytes)?;
    let tmp_file = with_orphan
        .join(OVERFLOW_DIR_NAME)
        .join("0000000000000004.ovf.tmp");
    std::fs::write(&tmp_file, [0u8; 17])?;
    let v = inspect_json(&with_orphan, 0);
    let o = &v["overflow"];
    let f3 = &o["files"][2];
    assert_eq!(f3["file"].as_str().map(PathBuf::from), Some(orphan.clone()));
    assert_eq!(
        (&f3["entries"], &f3["live_entries"]),
        (&1.into(), &0.into())
    );
    assert_eq!(f3["orphan"], true, "{f3}");
    assert_eq!(f3["dead_fraction"], 1.0, "{f3}");
    assert_eq!(o["total"]["orphan_files"], 1);
    assert_eq!(o["total"]["last_due"], due(DAY * 7));
    assert_eq!(
        o["tmp_files"][0]["file"].as_str().map(PathBuf::from),
        Some(tmp_file.clone())
    );
    assert_eq!(o["tmp_files"][0]["bytes"], 17);
    let (stdout, _) = run(&["inspect", path(&with_orphan)], 0);
    assert!(
        stdout.contains("0000000000000003.ovf  99 bytes, 1 entry, 0 live (100.0% dead)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("orphan: no checkpoint in use refers to it (the engine removes it)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("leftovers     0000000000000004.ovf.tmp 17 bytes"),
        "{stdout}"
    );
    let engine = Engine::open(&with_orphan, config())?;
    assert_eq!(engine.stats().payloads_on_disk, 11);
    engine.shutdown()?;
    assert!(!orphan.exists() && !tmp_file.exists());
    let v = inspect_json(&with_orphan, 0);
    assert_eq!(v["overflow"]["total"]["files"], 2, "{v}");
    assert_eq!(v["overflow"]["total"]["live_entries"], 11, "{v}");
    Ok(())
}

#[test]
fn a_damaged_or_missing_overflow_file_is_named_by_file_and_offset() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    let entries = overflow::read_file(&FsStorage, &ovf_path(&built, 1), None, Some(1))?;
    let entry_of = |key: &[u8]| {
        entries
            .iter()
            .find(|(_, e)| &*e.key == key)
            .map(|(o, _)| *o)
            .ok_or("no such entry")
    };

    // One bit flipped in a:0's entry, which a live task needs.
    let dir = tmp.path().join("flipped");
    copy_tree(&built, &dir)?;
    let file1 = ovf_path(&dir, 1);
    let mut bytes = std::fs::read(&file1)?;
    let offset = entry_of(b"a:0")?;
    bytes[offset as usize + 40] ^= 0x10;
    std::fs::write(&file1, &bytes)?;
    match overflow::read_file(&FsStorage, &file1, None, Some(1)) {
        Err(OverflowReadError::Corrupt { offset: at, .. }) => assert_eq!(at, offset),
        other => return Err(format!("the flipped file reads as {other:?}").into()),
    }

    let v = inspect_json(&dir, 1);
    assert_eq!(v["ok"], false);
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(file1.clone())
    );
    assert_eq!(v["error"]["offset"], offset);
    // The log is still read: the tasks are counted.
    assert_eq!(v["tasks"]["live"], 12, "{v}");
    let f1 = &v["overflow"]["files"][0];
    assert!(f1["entries"].is_null(), "{f1}");
    assert_eq!(f1["damage"]["offset"], offset, "{f1}");
    assert_eq!(f1["live_entries"], 7, "{f1}");
    assert_eq!(v["overflow"]["files"][1]["live_entries"], 4);
    assert_eq!(v["overflow"]["total"]["damaged_files"], 1);
    let (stdout, stderr) = run(&["inspect", path(&dir)], 1);
    assert!(
        stdout.contains(&format!("file    {}", file1.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("offset  {offset} (byte offset in the file)")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "0000000000000001.ovf  {} bytes; DAMAGED at byte offset {offset}",
            bytes.len()
        )),
        "{stdout}"
    );
    assert!(stderr.contains(&file1.display().to_string()), "{stderr}");
    assert!(stderr.contains("kairos salvage"), "{stderr}");
    // The log was read whole: not "before the damage".
    assert!(!stdout.contains("before the damage"), "{stdout}");
    assert!(stdout.contains("clean shutdown  yes"), "{stdout}");
    assert!(
        stdout.contains("overflow        2 files (1 damaged), "),
        "{stdout}"
    );
    assert!(
        stdout.contains(": 5 entries in those that read back, 11 live, due"),
        "{stdout}"
    );
    // verify and dump agree.
    let (stdout, stderr) = run(&["verify", path(&dir)], 1);
    assert!(stdout.contains(&format!("offset  {offset}")), "{stdout}");
    assert!(stderr.contains("kairos salvage"), "{stderr}");
    let (_, stderr) = run(&["dump", path(&dir)], 1);
    assert!(stderr.contains(&format!("offset  {offset}")), "{stderr}");

    // The same flip in a:3's entry, whose payload a reschedule after the checkpoint
    // replaced: no live task needs it, the engine opens. The three tools name it as a
    // warning.
    let dir = tmp.path().join("flipped-dead");
    copy_tree(&built, &dir)?;
    let file1 = ovf_path(&dir, 1);
    let dead = entry_of(b"a:3")?;
    let mut bytes = std::fs::read(&file1)?;
    bytes[dead as usize + 40] ^= 0x10;
    std::fs::write(&file1, &bytes)?;
    let v = inspect_json(&dir, 0);
    assert!(v["error"].is_null(), "{v}");
    let warned = v["warnings"].as_array().ok_or("warnings")?;
    assert_eq!(warned.len(), 1, "{v}");
    assert_eq!(warned[0]["offset"], dead, "{v}");
    assert_eq!(v["overflow"]["files"][0]["damage"]["offset"], dead, "{v}");
    let (stdout, _) = run(&["verify", path(&dir)], 0);
    assert!(stdout.contains("WARNING: overflow file"), "{stdout}");
    assert!(stdout.contains(&format!("offset  {dead}")), "{stdout}");
    let (_, stderr) = run(&["dump", path(&dir)], 0);
    assert!(stderr.contains("kairos dump: warning"), "{stderr}");
    assert!(stderr.contains(&format!("offset  {dead}")), "{stderr}");
    Engine::open(&dir, config())?.shutdown()?;

    // File 2 missing: named, without an offset.
    let dir = tmp.path().join("missing");
    copy_tree(&built, &dir)?;
    let file2 = ovf_path(&dir, 2);
    std::fs::remove_file(&file2)?;
    let v = inspect_json(&dir, 1);
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(file2.clone())
    );
    assert!(v["error"]["offset"].is_null(), "{v}");
    let f2 = &v["overflow"]["files"][1];
    assert!(f2["bytes"].is_null() && f2["entries"].is_null(), "{f2}");
    assert_eq!(f2["live_entries"], 4, "{f2}");
    assert_eq!(v["overflow"]["files"][0]["live_entries"], 7);
    assert!(Engine::open(&dir, config()).is_err());
    Ok(())
}
