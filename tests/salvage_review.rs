//! Review of far promotion past damaged overflow entries and of `kairos salvage` /
//! `kairos verify` judging overflow damage against the tasks live at the end of the log:
//! each test is one scenario where the CLI's verdict is checked against what the engine
//! does with the same directory.

#![cfg(feature = "cli")]

mod common;

use common::cli::{copy_tree, json, path, run, tree_bytes};
use common::far::{
    at, due, far_dir, fire_dir as fire, fire_on, key, overflow_entries as entries, overflow_file,
    MINUTE,
};
use common::{drain, open_fs, TaskMap, TestResult, START_MS};
use kairos::ManualClock;
use kairos_wal::FsStorage;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::far::cfg_one_attempt as config;

/// An overflow file cut short exactly at an entry boundary, losing only the entry of a far
/// task cancelled after the checkpoint: the engine opens and fires every other far task, so
/// `verify` must pass (a warning) and `salvage` must find nothing to discard.
#[test]
fn a_file_cut_at_an_entry_boundary_losing_only_dead_entries_verifies() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 10;
    let model = far_dir(&dir, n, &[n - 1])?;
    let (last_offset, _) = entries(&dir, 1)?[&key(n - 1)];
    let file = overflow_file(&dir, 1);
    let bytes = std::fs::read(&file)?;
    std::fs::write(&file, &bytes[..last_offset as usize])?;

    let copy = tmp.path().join("copy");
    copy_tree(&dir, &copy)?;
    // The engine opens and fires everything that is left.
    assert_eq!(fire(&copy, START_MS, due(n + 2))?, model);

    run(&["verify", path(&dir)], 0);
    run(&["inspect", path(&dir)], 0);
    run(&["dump", path(&dir)], 0);
    let (stdout, _) = run(&["salvage", path(&dir), "--json"], 0);
    assert_eq!(json(&stdout)["damaged"].as_array().map(Vec::len), Some(0));
    Ok(())
}

/// The same cut losing a live far task's entry: the engine refuses to open; `salvage` must
/// list that far task and `--discard` must make the directory open, every other far task
/// firing once.
#[test]
fn a_file_cut_at_an_entry_boundary_losing_a_far_task_is_salvaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 10;
    let mut model = far_dir(&dir, n, &[])?;
    let (last_offset, last_id) = entries(&dir, 1)?[&key(n - 1)];
    let file = overflow_file(&dir, 1);
    let bytes = std::fs::read(&file)?;
    std::fs::write(&file, &bytes[..last_offset as usize])?;
    let clock = ManualClock::new(START_MS);
    assert!(open_fs(&dir, config(), &clock).is_err());

    run(&["verify", path(&dir)], 1);
    let (stdout, _) = run(&["salvage", path(&dir), "--json"], 1);
    let v = json(&stdout);
    let listed: Vec<u64> = v["damaged"]
        .as_array()
        .ok_or("damaged")?
        .iter()
        .filter_map(|d| d["task_id"].as_u64())
        .collect();
    assert_eq!(listed, vec![last_id], "{v}");
    run(&["salvage", path(&dir), "--discard"], 0);
    model.remove(&key(n - 1));
    assert_eq!(fire(&dir, START_MS, due(n + 2))?, model);
    run(&["verify", path(&dir)], 0);
    Ok(())
}

/// Flips a byte of the key of the entry of each key in `keys` in overflow file `n`; returns
/// their task ids.
fn flip_keys(dir: &Path, n: u32, keys: &[&[u8]]) -> TestResult<Vec<u64>> {
    let found = entries(dir, n)?;
    let file = overflow_file(dir, n);
    let mut bytes = std::fs::read(&file)?;
    let mut ids = Vec::new();
    for k in keys {
        let (offset, id) = found.get(*k).ok_or("no such entry")?;
        bytes[*offset as usize + 30] ^= 0x20;
        ids.push(*id);
    }
    std::fs::write(&file, &bytes)?;
    Ok(ids)
}

/// The task ids `salvage --json` lists as damaged.
fn listed(dir: &Path, status: i32) -> TestResult<Vec<u64>> {
    let (stdout, _) = run(&["salvage", path(dir), "--json"], status);
    let v = json(&stdout);
    let mut ids: Vec<u64> = v["damaged"]
        .as_array()
        .ok_or("damaged")?
        .iter()
        .filter_map(|d| d["task_id"].as_u64())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// The log's records (LSN, type, body), and the files outside the log by path.
type DurableState = (Vec<(u64, u8, Vec<u8>)>, BTreeMap<PathBuf, Vec<u8>>);

/// The log's records (LSN, type, body) and the checkpoint and overflow files' bytes: what
/// a salvage that discards nothing must leave as it is (the log's marks — `SYNCED`, a
/// segment's mark slots, `CLOSED` — an open rewrites, as the engine's own open does).
fn durable_state(dir: &Path) -> TestResult<DurableState> {
    let mut records = Vec::new();
    kairos_wal::scan_located(
        &FsStorage,
        &dir.join("wal"),
        kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        &mut |view, _| records.push((view.lsn.0, view.record_type, view.body.to_vec())),
    )?;
    let files = tree_bytes(dir)?
        .into_iter()
        .filter(|(p, _)| !p.starts_with(dir.join("wal")))
        .collect();
    Ok((records, files))
}

/// `salvage --discard` on a directory where nothing is damaged — shut down cleanly, and
/// left by a crash — appends nothing and changes no checkpoint or overflow file.
#[test]
fn salvage_discard_with_nothing_damaged_writes_nothing() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    far_dir(&dir, 5, &[1])?;
    let before = durable_state(&dir)?;
    let bytes = tree_bytes(&dir)?;
    let (stdout, _) = run(&["salvage", path(&dir), "--discard"], 0);
    assert!(stdout.contains("damaged         none"), "{stdout}");
    assert_eq!(durable_state(&dir)?, before, "a clean directory");
    assert!(tree_bytes(&dir)? == bytes, "not a byte written");

    // Left by a crash: an engine dropped without shutdown after a schedule.
    let crashed = tmp.path().join("crashed");
    far_dir(&crashed, 5, &[])?;
    {
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(&crashed, config(), &clock)?;
        engine.schedule(b"late", at(START_MS + 3 * 60_000), b"late payload")?;
        drop(engine);
    }
    let before = durable_state(&crashed)?;
    let bytes = tree_bytes(&crashed)?;
    run(&["salvage", path(&crashed), "--discard"], 0);
    assert_eq!(durable_state(&crashed)?, before, "a crashed directory");
    assert!(tree_bytes(&crashed)? == bytes, "not a byte written");
    run(&["salvage", path(&crashed), "--discard"], 0);
    assert_eq!(durable_state(&crashed)?, before, "run twice");
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(&crashed, config(), &clock)?;
    let fired = fire_on(&engine, &clock, due(6))?;
    assert_eq!(fired.len(), 6);
    engine.shutdown()?;
    Ok(())
}

/// A far task promoted, delivered and acked after the checkpoint (between checkpoints, as
/// every far task that fires is), whose entry then rots: the task is finished, nothing live
/// needs the entry. (Review finding: the open's replay read the entry for the DELIVER that
/// names the far task and refused, so the directory never opened again, and salvage refused
/// it.) The replay now holds the task by id, its key unread, until the ACK finishes it: the
/// engine opens and fires the four others, verify warns, salvage finds nothing to do.
#[test]
fn a_fired_far_tasks_damaged_entry_is_no_damage() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 5;
    let mut model = far_dir(&dir, n, &[])?;
    // Far task 0 fires and is acked; nothing checkpoints after.
    {
        let clock = ManualClock::new(due(0) - 30 * 60_000);
        let engine = open_fs(&dir, config(), &clock)?;
        let fired = fire_on(&engine, &clock, due(0))?;
        assert_eq!(fired.len(), 1);
        assert!(fired.contains_key(&key(0)));
        engine.shutdown()?;
    }
    model.remove(&key(0));
    flip_keys(&dir, 1, &[&key(0)])?;
    for tool in ["verify", "inspect", "dump"] {
        let (stdout, stderr) = run(&[tool, path(&dir)], 0);
        assert!(
            format!("{stdout}{stderr}")
                .to_lowercase()
                .contains("warning"),
            "{tool}: {stdout}{stderr}"
        );
    }
    assert_eq!(listed(&dir, 0)?, Vec::<u64>::new());
    let bytes = tree_bytes(&dir)?;
    run(&["salvage", path(&dir), "--discard"], 0);
    assert!(tree_bytes(&dir)? == bytes, "salvage wrote to the directory");
    assert_eq!(fire(&dir, due(0), due(n + 2))?, model);
    Ok(())
}

/// As [`a_fired_far_tasks_damaged_entry_is_no_damage`], but the process crashes while far
/// task 0 is delivered and not acked: the task is live (in flight) at the end of the log, its
/// key only in the damaged entry, so the directory does not open and every check fails;
/// salvage lists it, `--discard` cancels it, and then the engine opens and fires the others
/// once (task 0 never again).
#[test]
fn a_far_task_in_flight_with_a_damaged_entry_is_salvaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 5;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let clock = ManualClock::new(due(0) - 30 * 60_000);
        let engine = open_fs(&dir, config(), &clock)?;
        clock.advance(Duration::from_millis(30 * 60_000));
        let ds = drain(&engine)?;
        assert_eq!(ds.len(), 1);
        drop(ds);
        drop(engine); // a crash: task 0 stays in flight
    }
    model.remove(&key(0));
    let ids = flip_keys(&dir, 1, &[&key(0)])?;
    let refused = open_fs(&dir, config(), &ManualClock::new(START_MS))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains(&format!("far task {}", ids[0])) && refused.contains("kairos salvage"),
        "{refused}"
    );
    for tool in ["verify", "inspect", "dump"] {
        run(&[tool, path(&dir)], 1);
    }
    assert_eq!(listed(&dir, 1)?, ids);
    run(&["salvage", path(&dir), "--discard"], 0);
    run(&["verify", path(&dir)], 0);
    assert_eq!(fire(&dir, due(0), due(n + 2))?, model);
    Ok(())
}

/// Tasks in flight whose payloads are on disk, left by a crash; one's payload entry is
/// damaged. salvage lists exactly it; after --discard the engine opens and delivers every
/// other task once with its payload, and checkpoints and reopens repeatedly.
#[test]
fn in_flight_payload_damage_after_a_crash_is_salvaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let mut model = TaskMap::new();
    let mut config = config();
    config.retry.max_attempts = 5;
    {
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(&dir, config.clone(), &clock)?;
        for i in 0..6u64 {
            let (k, d, p) = (
                format!("near-{i}").into_bytes(),
                START_MS + (10 + i) * 60_000,
                format!("near payload {i}").into_bytes(),
            );
            engine.schedule(&k, at(d), &p)?;
            model.insert(k, (d, p));
        }
        for i in 0..4 {
            let payload = format!("payload {i}").into_bytes();
            engine.schedule(&key(i), at(due(i)), &payload)?;
            model.insert(key(i), (due(i), payload));
        }
        let report = engine.checkpoint()?;
        assert_eq!(report.payloads_moved, 10, "{report:?}");
        // near-0..=2 handed out, not acked; then a crash.
        clock.advance(Duration::from_millis(12 * 60_000));
        let ds = drain(&engine)?;
        assert_eq!(ds.len(), 3);
        drop(ds);
        drop(engine);
    }
    let ids = flip_keys(&dir, 1, &[b"near-1"])?;
    model.remove(b"near-1".as_slice());
    assert_eq!(listed(&dir, 1)?, ids);
    run(&["verify", path(&dir)], 1);
    run(&["salvage", path(&dir), "--discard"], 0);
    run(&["verify", path(&dir)], 0);
    assert_eq!(listed(&dir, 0)?, Vec::<u64>::new());
    // Delivered once each, checkpointing and reopening between.
    let mut fired = TaskMap::new();
    let mut now = START_MS + 12 * 60_000;
    for round in 0..4 {
        let clock = ManualClock::new(now);
        let engine = open_fs(&dir, config.clone(), &clock)?;
        let until = now + 40 * 60_000;
        for (k, v) in fire_on(&engine, &clock, until)? {
            assert!(fired.insert(k.clone(), v).is_none(), "twice: {k:?}");
        }
        engine.checkpoint()?;
        engine.shutdown()?;
        now = until;
        run(&["verify", path(&dir)], 0);
        let _ = round;
    }
    assert_eq!(fired, model);
    Ok(())
}

/// Flips a byte of each entry of `spots` (key, at the length field when `true`, else the
/// key) in overflow file `n`.
fn flip(dir: &Path, n: u32, spots: &[(Vec<u8>, bool)]) -> TestResult {
    let found = entries(dir, n)?;
    let file = overflow_file(dir, n);
    let mut bytes = std::fs::read(&file)?;
    for (k, length) in spots {
        let (offset, _) = found.get(k).ok_or("no such entry")?;
        let at = *offset as usize + if *length { 1 } else { 30 };
        bytes[at] ^= 0x40;
    }
    std::fs::write(&file, &bytes)?;
    Ok(())
}

/// Far tasks in two overflow files, runs of damaged entries of cancelled far tasks in each
/// (length fields and keys, the second file's last entry), the prefetch thread promoting:
/// every other far task fires once, on time — opened long before, and opened with the
/// damage within the open's far span — and verify passes with warnings, salvage lists none.
#[test]
fn runs_of_dead_damaged_entries_in_two_files_with_prefetch() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    let mut c = config();
    c.payload_prefetch = true;
    let mut model = TaskMap::new();
    {
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(&built, c.clone(), &clock)?;
        for range in [0..40, 40..80] {
            for i in range {
                let payload = format!("payload {i}").into_bytes();
                engine.schedule(&key(i), at(due(i)), &payload)?;
                model.insert(key(i), (due(i), payload));
            }
            engine.checkpoint()?;
        }
        assert_eq!(engine.stats().far, 80);
        for i in [10, 11, 12, 13, 14, 50, 51, 52, 79] {
            assert!(engine.cancel(&key(i))?.is_cancelled());
            model.remove(&key(i));
        }
        engine.shutdown()?;
    }
    assert!(overflow_file(&built, 2).exists());
    flip(
        &built,
        1,
        &[
            (key(10), true),
            (key(11), false),
            (key(12), false),
            (key(13), true),
            (key(14), false),
        ],
    )?;
    flip(
        &built,
        2,
        &[
            (key(50), false),
            (key(51), true),
            (key(52), false),
            (key(79), true),
        ],
    )?;
    run(&["verify", path(&built)], 0);
    assert_eq!(listed(&built, 0)?, Vec::<u64>::new());
    for (name, open_at) in [
        ("long before", START_MS),
        ("damage within the span", due(12) - 20 * 60_000),
        ("overdue", due(60)),
    ] {
        let dir = tmp.path().join(name);
        copy_tree(&built, &dir)?;
        let clock = ManualClock::new(open_at);
        let engine = open_fs(&dir, c.clone(), &clock)?;
        let fired = fire_on(&engine, &clock, due(85))?;
        let want: TaskMap = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert_eq!(fired, want, "{name}");
        engine.checkpoint()?;
        engine.shutdown()?;
        run(&["verify", path(&dir)], 0);
    }
    Ok(())
}

/// A zero-filled tail after the last entry (a file extended, never written), the last far
/// task cancelled: verify warns, the engine opens and fires the others.
#[test]
fn a_zero_filled_tail_is_gone_past() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let model = far_dir(&dir, 6, &[2])?;
    let file = overflow_file(&dir, 1);
    let mut bytes = std::fs::read(&file)?;
    bytes.extend(std::iter::repeat_n(0u8, 5000));
    std::fs::write(&file, &bytes)?;
    run(&["verify", path(&dir)], 0);
    run(&["inspect", path(&dir)], 0);
    run(&["dump", path(&dir)], 0);
    assert_eq!(listed(&dir, 0)?, Vec::<u64>::new());
    let copy = tmp.path().join("copy");
    copy_tree(&dir, &copy)?;
    assert_eq!(fire(&copy, START_MS, due(8))?, model);
    assert_eq!(fire(&dir, due(7), due(8))?, model);
    Ok(())
}

/// A damaged dead entry in a file mostly dead (a compaction victim): checkpoints go on (the
/// file is not compacted), the engine reopens repeatedly, every live far task fires once.
#[test]
fn a_damaged_compaction_victim_does_not_stop_checkpoints() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 20;
    let cancelled: Vec<usize> = (0..n).filter(|i| i % 4 != 0).collect();
    let mut model = far_dir(&dir, n, &cancelled)?;
    flip(&dir, 1, &[(key(5), true), (key(6), false)])?;
    run(&["verify", path(&dir)], 0);
    for round in 0..3usize {
        let clock = ManualClock::new(START_MS + round as u64 * 60_000);
        let engine = open_fs(&dir, config(), &clock)?;
        for j in 0..5 {
            let i = 100 + round * 5 + j;
            let payload = format!("payload {i}").into_bytes();
            engine.schedule(&key(i), at(due(i)), &payload)?;
            model.insert(key(i), (due(i), payload));
        }
        engine.checkpoint()?;
        engine.checkpoint()?;
        engine.shutdown()?;
        run(&["verify", path(&dir)], 0);
    }
    assert_eq!(fire(&dir, START_MS + 5 * 60_000, due(130))?, model);
    run(&["verify", path(&dir)], 0);
    Ok(())
}

/// A far task given a new payload after the checkpoint, its old entry (where its key is)
/// then damaged: the RESCHEDULE's replay cannot read the key, and the task is live at the end
/// of the log, so the directory does not open: verify, inspect and dump say so (exit 1),
/// salvage lists the task, `--discard` cancels it, and the engine then opens and fires every
/// other far task once. (The fired-and-acked case, [`a_fired_far_tasks_damaged_entry_is_no_damage`],
/// opens: the replay holds such a task by id until the end of the log.)
#[test]
fn a_live_far_tasks_damaged_entry_named_since_the_checkpoint_is_salvaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let moved = tmp.path().join("moved");
    let mut model = far_dir(&moved, 5, &[])?;
    {
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(&moved, config(), &clock)?;
        engine.reschedule(&key(1), at(START_MS + 10 * 60_000), Some(b"new payload"))?;
        engine.shutdown()?;
    }
    model.remove(&key(1));
    let ids = flip_keys(&moved, 1, &[&key(1)])?;
    let refused = open_fs(&moved, config(), &ManualClock::new(START_MS))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("far task") && refused.contains("kairos salvage"),
        "{refused}"
    );
    for tool in ["verify", "inspect", "dump"] {
        let (stdout, stderr) = run(&[tool, path(&moved)], 1);
        assert!(
            format!("{stdout}{stderr}").contains("salvage"),
            "{tool}: {stdout}{stderr}"
        );
    }
    assert_eq!(listed(&moved, 1)?, ids);
    run(&["salvage", path(&moved), "--discard"], 0);
    run(&["verify", path(&moved)], 0);
    assert_eq!(listed(&moved, 0)?, Vec::<u64>::new());
    assert_eq!(fire(&moved, START_MS, due(7))?, model);
    Ok(())
}

/// An overflow file the checkpoint names whose far tasks were all cancelled after it, its
/// header then damaged: no task needs anything in it, as when it is missing. (Review finding:
/// the open read its header and refused, verify failed, salvage refused — the directory
/// opened again only once someone deleted the file by hand.) Now the open counts it empty
/// (the next checkpoint deletes it) and every check warns. With a live far task in it, every
/// check fails; salvage lists every far task it holds and `--discard` makes the directory
/// open, the other tasks firing once.
#[test]
fn a_damaged_header_of_a_file_no_task_needs() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    far_dir(&dir, 3, &[0, 1, 2])?;
    let file = overflow_file(&dir, 1);
    let mut bytes = std::fs::read(&file)?;
    bytes[40] ^= 0x01; // entry_count: the header's CRC no longer matches
    std::fs::write(&file, &bytes)?;
    // Deleting it: the engine opens (a warning for verify).
    let deleted = tmp.path().join("deleted");
    copy_tree(&dir, &deleted)?;
    std::fs::remove_file(overflow_file(&deleted, 1))?;
    run(&["verify", path(&deleted)], 0);
    open_fs(&deleted, config(), &ManualClock::new(START_MS))?.shutdown()?;
    // Damaged in place: the same.
    for tool in ["verify", "inspect", "dump"] {
        let (stdout, stderr) = run(&[tool, path(&dir)], 0);
        assert!(
            format!("{stdout}{stderr}").contains("header"),
            "{tool}: {stdout}{stderr}"
        );
    }
    assert_eq!(listed(&dir, 0)?, Vec::<u64>::new());
    let engine = open_fs(&dir, config(), &ManualClock::new(START_MS))?;
    assert_eq!(engine.stats().pending, 0);
    engine.checkpoint()?;
    engine.shutdown()?;
    assert!(
        !overflow_file(&dir, 1).exists(),
        "the next checkpoint deletes it"
    );
    run(&["verify", path(&dir)], 0);

    // A live far task among them: the file is needed, every check fails.
    let live = tmp.path().join("live");
    let model = far_dir(&live, 3, &[0])?;
    let ids: Vec<u64> = {
        let mut ids: Vec<u64> = entries(&live, 1)?
            .into_iter()
            .filter(|(k, _)| model.contains_key(k))
            .map(|(_, (_, id))| id)
            .collect();
        ids.sort_unstable();
        ids
    };
    let file = overflow_file(&live, 1);
    let mut bytes = std::fs::read(&file)?;
    bytes[40] ^= 0x01;
    std::fs::write(&file, &bytes)?;
    assert!(open_fs(&live, config(), &ManualClock::new(START_MS)).is_err());
    for tool in ["verify", "inspect", "dump"] {
        run(&[tool, path(&live)], 1);
    }
    assert_eq!(listed(&live, 1)?, ids, "both far tasks left in the file");
    run(&["salvage", path(&live), "--discard"], 0);
    run(&["verify", path(&live)], 0);
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(&live, config(), &clock)?;
    assert_eq!(engine.stats().pending, 0);
    engine.shutdown()?;
    Ok(())
}

/// Only a dead letter's payload (on disk) is damaged: verify, inspect and dump agree (it is
/// needed: exit 1), salvage lists exactly it, and after --discard every check passes and
/// the engine opens with no dead letter.
#[test]
fn a_damaged_dead_letter_payload_is_judged_alike_everywhere() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    {
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(&dir, config(), &clock)?;
        engine.schedule(b"dl", at(START_MS + 5 * 60_000), b"dead letter payload")?;
        engine.schedule(b"other", at(START_MS + 50 * 60_000), b"other payload")?;
        assert_eq!(engine.checkpoint()?.payloads_moved, 2);
        clock.advance(5 * MINUTE);
        let ds = drain(&engine)?;
        assert_eq!(ds.len(), 1);
        engine.consumer().nack(&ds[0], None, "failed")?;
        assert_eq!(engine.dead_letters().len(), 1);
        engine.shutdown()?;
    }
    let ids = flip_keys(&dir, 1, &[b"dl"])?;
    run(&["verify", path(&dir)], 1);
    run(&["inspect", path(&dir)], 1);
    run(&["dump", path(&dir)], 1);
    assert_eq!(listed(&dir, 1)?, ids);
    run(&["salvage", path(&dir), "--discard"], 0);
    run(&["verify", path(&dir)], 0);
    run(&["inspect", path(&dir)], 0);
    run(&["dump", path(&dir)], 0);
    let clock = ManualClock::new(START_MS + 6 * 60_000);
    let engine = open_fs(&dir, config(), &clock)?;
    assert!(engine.dead_letters().is_empty());
    let fired = fire_on(&engine, &clock, START_MS + 60 * 60_000)?;
    assert_eq!(
        fired.keys().cloned().collect::<Vec<_>>(),
        vec![b"other".to_vec()]
    );
    engine.checkpoint()?;
    engine.shutdown()?;
    run(&["verify", path(&dir)], 0);
    Ok(())
}

/// A missing overflow file holding live far tasks that no record after the checkpoint names:
/// the open's error says how many tasks need it and points at salvage (review finding: it
/// named neither).
#[test]
fn a_missing_overflow_file_says_how_many_tasks_need_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    far_dir(&dir, 3, &[])?;
    std::fs::remove_file(overflow_file(&dir, 1))?;
    let refused = open_fs(&dir, config(), &ManualClock::new(START_MS))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("which is missing: entries in it are needed by 3 live tasks or dead letters (`kairos salvage` lists them"),
        "{refused}"
    );
    assert_eq!(listed(&dir, 1)?.len(), 3);
    Ok(())
}

/// Entries out of (due, id) order, each intact (the writer never leaves a file so: damage that
/// kept the CRCs whole). Far tasks 0 and 2 are cancelled after the checkpoint and their
/// entries swapped: task 0's (due first) now third, task 2's first — so far task 1's own
/// entry, in its place, follows one due later. The promotion goes past task 0's entry (no far
/// task owns it) but cannot place task 1's and poisons the engine, naming the task; `verify`
/// fails naming it, `salvage` lists it, and `--discard` cancels it: every other far task then
/// fires once, and verify passes (a warning for the entries no task needs).
#[test]
fn a_far_tasks_entry_out_of_order_is_salvaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 10;
    let mut model = far_dir(&dir, n, &[0, 2])?;
    let found = entries(&dir, 1)?;
    let (first, _) = found[&key(0)];
    let (third, _) = found[&key(2)];
    let (second, id) = found[&key(1)];
    let size = (second - first) as usize;
    assert_eq!(third - second, second - first, "equal entries expected");
    let file = overflow_file(&dir, 1);
    let mut bytes = std::fs::read(&file)?;
    let (a, b) = (first as usize, third as usize);
    let entry_a = bytes[a..a + size].to_vec();
    bytes.copy_within(b..b + size, a);
    bytes[b..b + size].copy_from_slice(&entry_a);
    std::fs::write(&file, &bytes)?;

    let copy = tmp.path().join("copy");
    copy_tree(&dir, &copy)?;
    let poisoned = fire(&copy, START_MS, due(n + 2))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        poisoned.contains(&format!("far task {id} out of (due time, task id) order")),
        "{poisoned}"
    );

    let (stdout, _) = run(&["verify", path(&dir), "--json"], 1);
    let message = json(&stdout)["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains(&format!("far task {id}")) && message.contains("out of (due time"),
        "{message}"
    );
    run(&["inspect", path(&dir)], 1);
    run(&["dump", path(&dir)], 1);
    assert_eq!(listed(&dir, 1)?, vec![id]);
    run(&["salvage", path(&dir), "--discard"], 0);
    model.remove(&key(1));
    assert_eq!(fire(&dir, START_MS, due(n + 2))?, model);
    run(&["verify", path(&dir)], 0);
    Ok(())
}

/// A waiting task's payload entry out of (due, id) order — behind the entry of a task cancelled
/// since, whose due time the damage raised (CRCs kept whole) — is read only by offset while the
/// task is not far, so `verify` passes (a warning: no far task's entry is out of order). Its
/// walk ([`kairos::overflow::walk_far_entries`]) counts only the checkpoint's far tasks, which
/// holds only if no checkpoint later makes such a task far *in place* (where its entry is):
/// the file would gain a far task whose entry is out of order, and the promotion would poison
/// the engine on it. A checkpoint does that to a waiting task due beyond the far span whose
/// entry's due time is still the task's — never one opened from a checkpoint (whether the
/// entry's due time is still the task's is not known then). Here the horizon shrinks between
/// two runs so that `q` is due beyond the far span: the checkpoint leaves it in the wheel,
/// and every task fires once.
#[test]
fn a_payload_entry_out_of_order_is_not_made_far_in_place_after_a_reopen() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let hour = 3_600_000;
    // Run 1, a 3 h horizon: `c` and `q` (due 2 h 29 and 2 h 30 out) are near, their payloads
    // spilled to overflow file 1 (beyond the one-minute payload window); `r` and `s` (5 h and
    // 6 h out) go far in the same file.
    let mut wide = config();
    wide.horizon = Some(Duration::from_secs(3 * 3600));
    let (c, q, r, s) = (b"task-c", b"task-q", b"task-r", b"task-s");
    let (c_due, q_due) = (
        START_MS + 2 * hour + 29 * 60_000,
        START_MS + 2 * hour + 30 * 60_000,
    );
    let (r_due, s_due) = (START_MS + 5 * hour, START_MS + 6 * hour);
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(&dir, wide, &clock)?;
    for (k, d) in [(c, c_due), (q, q_due), (r, r_due), (s, s_due)] {
        engine.schedule(k, at(d), b"payload")?;
    }
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 2);
    assert!(engine.cancel(c)?.is_cancelled());
    engine.shutdown()?;
    drop(engine);
    // `c`'s entry (first in the file) raised to due after `q`'s, still before `r`'s.
    let found = entries(&dir, 1)?;
    let (c_at, _) = found[&c[..]];
    assert!(found[&q[..]].0 > c_at, "{found:?}");
    let file = overflow_file(&dir, 1);
    let mut bytes = std::fs::read(&file)?;
    let due_at = c_at as usize + 16;
    bytes[due_at..due_at + 8].copy_from_slice(&(q_due + 5 * 60_000).to_le_bytes());
    kairos::fuzzing::fix_overflow_crcs(&mut bytes);
    std::fs::write(&file, &bytes)?;
    run(&["verify", path(&dir)], 0);

    // Run 2, a one-hour horizon: `q` is due beyond the far span, but a checkpoint (taken with
    // something logged since the last) does not make it far.
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(&dir, config(), &clock)?;
    let n = b"task-n";
    engine.schedule(n, at(START_MS + 10 * 60_000), b"payload")?;
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 2, "q is not made far in place");
    let fired = fire_on(&engine, &clock, s_due + MINUTE.as_millis() as u64)?;
    let keys: Vec<&[u8]> = fired.keys().map(Vec::as_slice).collect();
    assert_eq!(keys, [&n[..], &q[..], &r[..], &s[..]]);
    engine.shutdown()?;
    Ok(())
}
