//! `kairos verify`, `inspect` and `dump` on a data directory whose checkpoint holds far tasks
//! (tasks beyond the horizon: the checkpoint keeps only their id, key hash and overflow entry;
//! key, due time and payload are in the entry). The engine does not write far tasks yet, so
//! the directory is built by hand: a log written with `kairos_wal::Wal` (record bodies laid
//! out as `wal/FORMAT.md` says), a checkpoint written with `CheckpointEncoder` and overflow
//! files written with `OverflowWriter`.
//!
//! The directory ([`build`]):
//! - LSN 1..=6: SCHEDULE tasks 1 `near` (due in a minute), 2 `ovf` (in 2 hours), 3 `far:3`,
//!   4 `far:4`, 5 `far:5` (in 30, 31 and 32 days) and 6 `gone`; LSN 7: CANCEL 6;
//! - overflow file 1: the entries of tasks 2, 3 and 4 (offsets 64, 108, 156); file 2: the
//!   entry of task 5 (offset 64);
//! - checkpoint at LSN 7: task 1 (payload inline), task 2 (payload in file 1), far tasks 3, 4
//!   (file 1) and 5 (file 2);
//! - above it ([`AFTER`]): LSN 8 CANCEL 4 (a far task, dropped without reading its entry),
//!   LSN 9 RESCHEDULE 3 keeping its payload (its key and due time read from its entry), LSN
//!   10 DELIVER 1, LSN 11 ACK 1, LSN 12 SCHEDULE 7 `late`.
//!
//! Live at the end: 2 and 3 (payloads in file 1), 5 (far, file 2), 7 (payload in memory).

#![cfg(feature = "cli")]

mod common;

use common::cli::{json, json_lines, path, run};
use common::{TestResult, START_MS};
use kairos::checkpoint::{
    file_name, CheckpointEncoder, CheckpointHeader, FarTask, PayloadAt, CHECKPOINT_DIR_NAME,
};
use kairos::far::KeyHasher;
use kairos::overflow::{self, OverflowWriter, OVERFLOW_DIR_NAME};
use kairos_wal::FsStorage;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

const CANCEL: u8 = 2;
const DELIVER: u8 = 3;
const ACK: u8 = 4;
const SCHEDULE: u8 = 1;
const RESCHEDULE: u8 = 8;

/// SCHEDULE body: `task_id u64, due_ms u64, key_len u16, payload_len u32, key, payload`.
fn schedule(id: u64, due_ms: u64, key: &[u8], payload: &[u8]) -> (u8, Vec<u8>) {
    let mut b = id.to_le_bytes().to_vec();
    b.extend_from_slice(&due_ms.to_le_bytes());
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(payload);
    (SCHEDULE, b)
}

/// A body of just `task_id u64` (CANCEL, ACK).
fn id_only(record_type: u8, id: u64) -> (u8, Vec<u8>) {
    (record_type, id.to_le_bytes().to_vec())
}

/// DELIVER body: `task_id u64, fired_ms u64`.
fn deliver(id: u64, fired_ms: u64) -> (u8, Vec<u8>) {
    let mut b = id.to_le_bytes().to_vec();
    b.extend_from_slice(&fired_ms.to_le_bytes());
    (DELIVER, b)
}

/// RESCHEDULE body keeping the payload: `task_id u64, due_ms u64, flag 0, payload_len 0`.
fn reschedule_keep(id: u64, due_ms: u64) -> (u8, Vec<u8>) {
    let mut b = id.to_le_bytes().to_vec();
    b.extend_from_slice(&due_ms.to_le_bytes());
    b.push(0);
    b.extend_from_slice(&0u32.to_le_bytes());
    (RESCHEDULE, b)
}

/// The far tasks' keys, due times and payloads.
fn far_key(id: u64) -> Vec<u8> {
    format!("far:{id}").into_bytes()
}
fn far_due(id: u64) -> u64 {
    START_MS + (27 + id) * DAY_MS
}
fn far_payload(id: u64) -> Vec<u8> {
    format!("far payload {id}").into_bytes()
}

/// The records above the checkpoint (LSN 8..=12).
fn after() -> Vec<(u8, Vec<u8>)> {
    vec![
        id_only(CANCEL, 4),
        reschedule_keep(3, START_MS + 40 * DAY_MS),
        deliver(1, START_MS + MINUTE_MS),
        id_only(ACK, 1),
        schedule(7, START_MS + HOUR_MS, b"late", b"l"),
    ]
}
const AFTER: usize = 5;

/// What [`build`] wrote.
struct Built {
    store_id: [u8; 16],
    /// The checkpoint's far tasks (3, 4, 5), as written.
    far: Vec<FarTask>,
    /// Offset of task 2's entry in file 1.
    ovf2: u64,
}

impl Built {
    fn far(&self, id: u64) -> FarTask {
        self.far
            .iter()
            .copied()
            .find(|t| t.id == id)
            .expect("a far task")
    }

    /// The key hash, as `kairos dump` prints it.
    fn hash_hex(&self, id: u64) -> String {
        format!("{:016x}", self.far(id).key_hash)
    }
}

/// Writes the checkpoint at LSN 7 of `dir` with `far` as its far tasks.
fn write_checkpoint(dir: &Path, built: &Built, far: &[FarTask]) -> TestResult {
    let mut enc = CheckpointEncoder::new(&CheckpointHeader {
        store_id: built.store_id,
        lsn: 7,
        max_task_id: 6,
        created_ms: START_MS,
    });
    enc.push_task(
        1,
        START_MS + MINUTE_MS,
        0,
        false,
        b"near",
        PayloadAt::Inline(b"n"),
    );
    enc.push_task(
        2,
        START_MS + 2 * HOUR_MS,
        0,
        false,
        b"ovf",
        PayloadAt::Overflow {
            file: 1,
            offset: built.ovf2,
        },
    );
    for t in far {
        enc.push_far(t);
    }
    let ckpt_dir = dir.join(CHECKPOINT_DIR_NAME);
    std::fs::create_dir_all(&ckpt_dir)?;
    std::fs::write(ckpt_dir.join(file_name(7)), enc.finish())?;
    Ok(())
}

/// Builds the directory described in the module docs, with `after` as the records above the
/// checkpoint.
fn build(dir: &Path, after: &[(u8, Vec<u8>)]) -> TestResult<Built> {
    let (wal, _) = kairos_wal::Wal::open(
        std::sync::Arc::new(FsStorage),
        &dir.join("wal"),
        kairos_wal::WalOptions::default(),
        &mut |_| Ok(()),
    )?;
    let store_id = wal.store_id();
    let mut before = vec![
        schedule(1, START_MS + MINUTE_MS, b"near", b"n"),
        schedule(2, START_MS + 2 * HOUR_MS, b"ovf", b"ovf payload"),
    ];
    for id in 3..=5 {
        before.push(schedule(id, far_due(id), &far_key(id), &far_payload(id)));
    }
    before.push(schedule(6, START_MS + DAY_MS, b"gone", b"g"));
    before.push(id_only(CANCEL, 6));
    let append = |records: &[(u8, Vec<u8>)]| -> TestResult {
        let records: Vec<kairos_wal::Record<'_>> = records
            .iter()
            .map(|(record_type, body)| kairos_wal::Record {
                record_type: *record_type,
                body,
            })
            .collect();
        wal.append(&records)?.wait()?;
        Ok(())
    };
    append(&before)?;
    assert_eq!(wal.last_lsn().0, 7);

    let ovf_dir = dir.join(OVERFLOW_DIR_NAME);
    std::fs::create_dir_all(&ovf_dir)?;
    let mut file1 = OverflowWriter::new(&store_id, 1);
    let ovf2 = file1.push(2, START_MS + 2 * HOUR_MS, b"ovf", b"ovf payload");
    let mut offsets = vec![];
    for id in [3, 4] {
        offsets.push((
            id,
            1,
            file1.push(id, far_due(id), &far_key(id), &far_payload(id)),
        ));
    }
    let mut file2 = OverflowWriter::new(&store_id, 2);
    offsets.push((
        5,
        2,
        file2.push(5, far_due(5), &far_key(5), &far_payload(5)),
    ));
    std::fs::write(ovf_dir.join(overflow::file_name(1)), file1.finish())?;
    std::fs::write(ovf_dir.join(overflow::file_name(2)), file2.finish())?;
    assert_eq!(ovf2, 64);
    assert_eq!(offsets, [(3, 1, 108), (4, 1, 156), (5, 2, 64)]);

    let hasher = KeyHasher::new(&store_id);
    let far = offsets
        .iter()
        .map(|&(id, file, offset)| FarTask {
            id,
            key_hash: hasher.hash(&far_key(id)),
            file,
            offset,
        })
        .collect();
    let built = Built {
        store_id,
        far,
        ovf2,
    };
    write_checkpoint(dir, &built, &built.far)?;
    append(after)?;
    wal.close()?;
    Ok(built)
}

fn ovf_path(dir: &Path, number: u32) -> PathBuf {
    dir.join(OVERFLOW_DIR_NAME)
        .join(overflow::file_name(number))
}

fn verify_json(dir: &Path, status: i32) -> Value {
    json(&run(&["verify", "--json", path(dir)], status).0)
}

fn inspect_json(dir: &Path, status: i32) -> Value {
    json(&run(&["inspect", "--json", path(dir)], status).0)
}

/// The RFC 3339 form of `ms`.
fn rfc3339(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(at).to_string()
}

#[test]
fn verify_replays_far_tasks_reading_their_entries() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir, &after())?;

    let v = verify_json(&dir, 0);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["records"], 7 + AFTER as u64);
    assert_eq!(v["bad_records"], 0);
    // 2, 3 (no longer far: the RESCHEDULE read its entry), 5 (far), 7.
    assert_eq!(v["live_tasks"], 4, "{v}");
    assert_eq!(v["far_tasks"], 1, "{v}");
    assert_eq!(v["live_delivered"], 0);
    let c = &v["checkpoint"];
    assert_eq!(
        (&c["lsn"], &c["tasks"], &c["far_tasks"], &c["dead_letters"]),
        (&json!(7), &json!(2), &json!(3), &json!(0)),
        "{c}"
    );

    let (stdout, _) = run(&["verify", path(&dir)], 0);
    let ckpt = dir.join(CHECKPOINT_DIR_NAME).join(file_name(7));
    for line in [
        format!(
            "checkpoint      {} at LSN 7: 2 live tasks, 3 far tasks, 0 dead letters; records above it replayed",
            ckpt.display()
        ),
        "live tasks      4 (0 delivered, not acked; 1 far, beyond the far span); 0 dead letters"
            .to_string(),
        "OK: every record checks".to_string(),
    ] {
        assert!(stdout.contains(&line), "no {line:?} in\n{stdout}");
    }
    Ok(())
}

#[test]
fn verify_refuses_a_far_entry_that_is_not_there() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir, &after())?;
    let file1 = ovf_path(&dir, 1);
    let file2 = ovf_path(&dir, 2);

    // Far task 5's key hash off by one bit: corruption naming file 2 and the entry's offset.
    let mut far = built.far.clone();
    far[2].key_hash ^= 1;
    write_checkpoint(&dir, &built, &far)?;
    let v = verify_json(&dir, 1);
    let e = &v["error"];
    assert_eq!(e["file"].as_str().map(PathBuf::from), Some(file2.clone()));
    assert_eq!(e["offset"], 64);
    assert_eq!(
        e["message"],
        format!(
            "overflow file {}: the entry of far task 5 at byte offset 64 has a key whose hash is {}, the checkpoint says {:016x}",
            file2.display(),
            built.hash_hex(5),
            built.far(5).key_hash ^ 1
        )
    );
    let (stdout, _) = run(&["verify", path(&dir)], 1);
    assert!(
        stdout.contains("  offset  64 (byte offset in the file)"),
        "{stdout}"
    );

    // Far task 3 placed at task 4's entry.
    let mut far = built.far.clone();
    far[0].offset = 156;
    write_checkpoint(&dir, &built, &far)?;
    let e = &verify_json(&dir, 1)["error"];
    assert_eq!(e["file"].as_str().map(PathBuf::from), Some(file1.clone()));
    assert_eq!(e["offset"], 156);
    assert_eq!(
        e["message"],
        format!(
            "overflow file {} has no entry of far task 3 at byte offset 156, where the checkpoint puts it",
            file1.display()
        )
    );

    // At an offset where no entry starts.
    let mut far = built.far.clone();
    far[0].offset = 109;
    write_checkpoint(&dir, &built, &far)?;
    let e = &verify_json(&dir, 1)["error"];
    assert_eq!(e["offset"], 109, "{e}");

    // Its file missing.
    write_checkpoint(&dir, &built, &built.far)?;
    verify_json(&dir, 0);
    std::fs::remove_file(&file2)?;
    let e = &verify_json(&dir, 1)["error"];
    assert_eq!(e["file"].as_str().map(PathBuf::from), Some(file2.clone()));
    assert!(e["offset"].is_null(), "{e}");
    Ok(())
}

#[test]
fn verify_refuses_a_far_key_already_live_when_a_record_needs_the_task() -> TestResult {
    // A schedule with far task 3's key is not checked against it (its key is on disk); the
    // reschedule of task 3 then reads its key, which is live: a bad record.
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(
        &dir,
        &[
            schedule(7, START_MS + HOUR_MS, b"far:3", b"x"),
            reschedule_keep(3, START_MS + 40 * DAY_MS),
        ],
    )?;
    let v = verify_json(&dir, 1);
    assert_eq!(v["bad_records"], 1, "{v}");
    let bad = &v["bad_record_details"][0];
    assert_eq!(bad["lsn"], 9);
    assert_eq!(
        bad["reason"],
        "far task 3 has key \"far:3\", which is already live"
    );
    // The file and byte offset of the record, as the log's own scan places it.
    let mut place = None;
    kairos_wal::scan_located(
        &FsStorage,
        &dir.join("wal"),
        kairos::config::PAYLOAD_BYTES_MAX_DEFAULT as u32 * 2,
        &mut |view, at| {
            if view.lsn.0 == 9 {
                place = Some((at.file.to_path_buf(), at.offset));
            }
        },
    )?;
    let (file, offset) = place.ok_or("LSN 9 not in the log")?;
    assert_eq!(bad["file"].as_str().map(PathBuf::from), Some(file.clone()));
    assert_eq!(bad["offset"], offset, "{bad}");
    let (stdout, _) = run(&["verify".as_ref(), dir.as_os_str()], 1);
    assert!(
        stdout.contains(&format!(
            "bad record at LSN 9 in {} at byte offset {offset}:",
            file.display()
        )),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn inspect_counts_far_tasks_and_their_entries() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir, &after())?;

    let v = inspect_json(&dir, 0);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(
        v["tasks"],
        json!({
            "live": 4,
            "waiting": 4,
            "far": 1,
            "in_flight": 0,
            "dead_letters": 0,
            "payload_in_memory": 1,
            "payload_in_overflow": 3,
        })
    );
    let c = &v["checkpoint"];
    assert_eq!(
        (&c["tasks"], &c["payloads_in_overflow"], &c["far_tasks"]),
        (&json!(2), &json!(1), &json!(3)),
        "{c}"
    );
    // File 1: tasks 2, 3 (live) and 4 (cancelled); file 2: far task 5, live.
    let files = &v["overflow"]["files"];
    let (f1, f2) = (&files[0], &files[1]);
    assert_eq!(
        (&f1["entries"], &f1["live_entries"], &f1["orphan"]),
        (&json!(3), &json!(2), &json!(false)),
        "{f1}"
    );
    assert_eq!(f1["live_bytes"], (30 + 3 + 11) + (30 + 5 + 13));
    assert_eq!(f1["dead_fraction"], 1.0 / 3.0);
    assert_eq!(
        (&f2["entries"], &f2["live_entries"], &f2["orphan"]),
        (&json!(1), &json!(1), &json!(false)),
        "{f2}"
    );
    assert_eq!(f2["dead_fraction"], 0.0);
    assert_eq!(f2["first_due"], rfc3339(far_due(5)));
    assert_eq!(v["overflow"]["total"]["live_entries"], 3);
    // The log's live bytes: the latest schedule of each live task — far task 5's SCHEDULE
    // (5 + 22 + 5 + 13) among them — 2's SCHEDULE (5 + 22 + 3 + 11), 3's RESCHEDULE (5 + 21)
    // and 7's SCHEDULE (5 + 22 + 4 + 1).
    assert_eq!(v["segments"][0]["live_bytes"], 45 + 41 + 26 + 32);

    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    for line in [
        "2 live tasks, 3 far tasks, 0 dead letters (largest task id 6)",
        "tasks           4 live: 4 waiting, 0 in flight (delivered, unsettled); 0 dead letters",
        "far             1 of the waiting (beyond the far span: not in memory; key, due time and payload in overflow files)",
        "payloads        1 in memory (in the checkpoint or logged after it), 3 in overflow files",
        "  0000000000000002.ovf  ",
    ] {
        assert!(stdout.contains(line), "no {line:?} in\n{stdout}");
    }
    assert!(stdout.ends_with("OK\n"), "{stdout}");
    Ok(())
}

#[test]
fn inspect_names_a_bad_far_entry_by_file_and_offset() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir, &after())?;
    let (file1, file2) = (ovf_path(&dir, 1), ovf_path(&dir, 2));

    // Far task 5 (no record names it): only the file's check finds the wrong hash.
    let mut far = built.far.clone();
    far[2].key_hash ^= 1 << 63;
    write_checkpoint(&dir, &built, &far)?;
    let v = inspect_json(&dir, 1);
    assert_eq!(v["bad_records"], 0, "{v}");
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(file2.clone())
    );
    assert_eq!(v["error"]["offset"], 64);
    let d = &v["overflow"]["files"][1]["damage"];
    assert_eq!(d["offset"], 64, "{d}");
    assert_eq!(v["overflow"]["total"]["damaged_files"], 1);
    // The log is read whole all the same.
    assert_eq!(v["records"], 7 + AFTER as u64);
    assert_eq!(v["tasks"]["far"], 1);

    // Far task 3, which the RESCHEDULE at LSN 9 needs whole: the record replays (the task is
    // held by id, its key unread) and the task is live at the end of the log, so its entry is
    // the error, as the file's check names it.
    let mut far = built.far.clone();
    far[0].key_hash ^= 1;
    write_checkpoint(&dir, &built, &far)?;
    let v = inspect_json(&dir, 1);
    assert_eq!(v["bad_records"], 0, "{v}");
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(file1.clone())
    );
    assert_eq!(v["error"]["offset"], 108);
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("far task 3")),
        "{v}"
    );
    assert_eq!(v["overflow"]["files"][0]["damage"]["offset"], 108);

    // File 2 missing: named, the rest read.
    write_checkpoint(&dir, &built, &built.far)?;
    inspect_json(&dir, 0);
    std::fs::remove_file(&file2)?;
    let v = inspect_json(&dir, 1);
    let f2 = &v["overflow"]["files"][1];
    assert_eq!(f2["file"].as_str().map(PathBuf::from), Some(file2.clone()));
    assert!(f2["bytes"].is_null() && f2["entries"].is_null(), "{f2}");
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(file2.clone())
    );
    let (stdout, _) = run(&["inspect", path(&dir)], 1);
    assert!(
        stdout.contains("  0000000000000002.ovf  missing or unreadable; DAMAGED"),
        "{stdout}"
    );
    Ok(())
}

#[test]
fn dump_prints_far_tasks_and_finds_one_by_key() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let built = build(&dir, &after())?;

    // Text: the checkpoint line, one line per far task by id, then every record.
    let (stdout, _) = run(&["dump", path(&dir)], 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 3 + 7 + AFTER, "{stdout}");
    assert_eq!(
        lines[..4],
        [
            "checkpoint 0000000000000007.ckpt at LSN 7: 2 live tasks, 3 far tasks, 0 dead letters"
                .to_string(),
            format!(
                "FAR task=3 key_hash={} file=1 offset=108",
                built.hash_hex(3)
            ),
            format!(
                "FAR task=4 key_hash={} file=1 offset=156",
                built.hash_hex(4)
            ),
            format!("FAR task=5 key_hash={} file=2 offset=64", built.hash_hex(5)),
        ]
    );
    assert!(lines[4].starts_with("1 ") && lines[4].contains(" SCHEDULE task=1 "));

    // JSON: the same fields.
    let (stdout, _) = run(&["dump", "--json", path(&dir)], 0);
    let v = json_lines(&stdout);
    assert_eq!(v.len(), 1 + 3 + 7 + AFTER);
    assert_eq!(
        (&v[0]["type"], &v[0]["tasks"], &v[0]["far_tasks"]),
        (&json!("CHECKPOINT"), &json!(2), &json!(3))
    );
    assert_eq!(
        v[1..4],
        [
            json!({"type": "FAR_TASK", "checkpoint_lsn": 7, "task_id": 3,
                   "key_hash": built.hash_hex(3), "file": 1, "offset": 108}),
            json!({"type": "FAR_TASK", "checkpoint_lsn": 7, "task_id": 4,
                   "key_hash": built.hash_hex(4), "file": 1, "offset": 156}),
            json!({"type": "FAR_TASK", "checkpoint_lsn": 7, "task_id": 5,
                   "key_hash": built.hash_hex(5), "file": 2, "offset": 64}),
        ]
    );

    // --key: the far task's SCHEDULE (still in the log), its state where the log passes the
    // checkpoint's LSN — key and due time read from its entry — and its RESCHEDULE.
    let (stdout, stderr) = run(&["dump", "--key", "far:3", path(&dir)], 0);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    assert!(lines[1].starts_with("3 ") && lines[1].contains(" SCHEDULE task=3 "));
    assert_eq!(
        lines[2],
        format!(
            "FAR task=3 key=\"far:3\" due={} key_hash={} file=1 offset=108",
            rfc3339(far_due(3)),
            built.hash_hex(3)
        )
    );
    assert!(lines[3].starts_with("9 ") && lines[3].contains(" RESCHEDULE task=3 "));
    assert!(
        stderr.contains(
            "kairos dump: 2 of 12 records shown: the history of task 3 (key \"far:3\"); the \
             checkpoint at LSN 7 holds the state of 1 of them"
        ),
        "{stderr}"
    );

    let (stdout, _) = run(&["dump", "--json", "--key", "far:5", path(&dir)], 0);
    let v = json_lines(&stdout);
    assert_eq!(v.len(), 3, "{stdout}");
    assert_eq!(v[1]["task_id"], 5);
    assert_eq!(
        v[2],
        json!({"type": "FAR_TASK", "checkpoint_lsn": 7, "task_id": 5,
               "key_hash": built.hash_hex(5), "file": 2, "offset": 64,
               "key": "far:5", "due_ms": far_due(5), "due": rfc3339(far_due(5))})
    );

    // A key no far task has: no far line.
    let (stdout, stderr) = run(&["dump", "--key", "far:9", path(&dir)], 0);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stderr.contains("no task had key \"far:9\""), "{stderr}");

    // An empty key, which no task can have: a usage error.
    let (stdout, stderr) = run(&["dump", "--key", "", path(&dir)], 2);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("a task's key is never empty"), "{stderr}");
    Ok(())
}

/// A damaged overflow file is reported as such; the checkpoint, which reads fine, is still
/// the dump's start (its far tasks listed), as the engine would open from it.
#[test]
fn dump_keeps_the_checkpoint_when_an_overflow_file_is_damaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir, &after())?;
    let file2 = ovf_path(&dir, 2);
    // Far task 5's entry (offset 64) cut short.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&file2)?
        .set_len(70)?;
    let (stdout, stderr) = run(&["dump", path(&dir)], 1);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 3 + 7 + AFTER, "{stdout}");
    assert!(
        lines[0].starts_with("checkpoint 0000000000000007.ckpt at LSN 7: "),
        "{stdout}"
    );
    assert!(lines[3].starts_with("FAR task=5 "), "{stdout}");
    assert!(
        stderr.contains("kairos dump: damaged overflow file")
            && stderr.contains(&file2.display().to_string()),
        "{stderr}"
    );
    assert!(!stderr.contains("without a checkpoint"), "{stderr}");
    assert!(!stderr.contains("damaged checkpoint"), "{stderr}");
    Ok(())
}

/// `--key` reads a far task's entry from its overflow file; when that fails, the summary says
/// what was found, as it does for other files: damaged bytes, a file that could not be read
/// (with the I/O error), or a missing one. It used to call every such file damaged. File 1 is
/// damaged (its header), so the check of the overflow files stops there and the read of far
/// task 5's entry in file 2 is the first to find file 2's state.
#[test]
fn dump_key_says_whether_a_far_entry_was_damaged_unreadable_or_missing() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir, &after())?;
    let (file1, file2) = (ovf_path(&dir, 1), ovf_path(&dir, 2));
    let mut bytes = std::fs::read(&file1)?;
    bytes[0] ^= 0xFF;
    std::fs::write(&file1, &bytes)?;
    let good2 = std::fs::read(&file2)?;
    // The lines the summary gives far task 5's entry, after file 1's.
    let far5 = |label: &str, why: &str| {
        format!(
            "kairos dump: {label} overflow file: cannot read the overflow entry of far task 5 \
             (overflow file 2, offset 64): {why}\n  file    {}\n  offset  64 (byte offset in \
             the file)\n",
            file2.display()
        )
    };
    let dump = || run(&["dump", "--key", "far:5", path(&dir)], 1).1;

    // Missing: the read's error, not a claim about bytes.
    std::fs::remove_file(&file2)?;
    let stderr = dump();
    assert!(
        stderr.contains(&format!(
            "kairos dump: damaged overflow file: overflow file {} is corrupt",
            file1.display()
        )),
        "{stderr}"
    );
    let missing = far5(
        "missing",
        &format!(
            "read {}: No such file or directory (os error 2)",
            file2.display()
        ),
    );
    assert!(stderr.contains(&missing), "{stderr}");

    // Unreadable: a directory in its place (the storage refuses to read it).
    std::fs::create_dir(&file2)?;
    let stderr = dump();
    let unreadable = far5(
        "unreadable",
        &format!("read {0}: {0} is not a regular file", file2.display()),
    );
    assert!(stderr.contains(&unreadable), "{stderr}");
    std::fs::remove_dir(&file2)?;

    // Damaged: the entry's bytes are there and wrong (its task id).
    let mut bad = good2.clone();
    bad[64] ^= 0x01;
    std::fs::write(&file2, &bad)?;
    let stderr = dump();
    assert!(
        stderr.contains(
            "kairos dump: damaged overflow file: cannot read the overflow entry of far task 5"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("unreadable overflow file"), "{stderr}");
    assert!(!stderr.contains("missing overflow file"), "{stderr}");
    Ok(())
}
