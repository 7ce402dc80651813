//! Review of far promotion past damaged overflow entries and of `kairos salvage` /
//! `kairos verify` judging overflow damage against the tasks live at the end of the log:
//! each test is one scenario where the CLI's verdict is checked against what the engine
//! does with the same directory.

#![cfg(feature = "cli")]

mod common;

use common::cli::{copy_tree, json, path, run};
use common::far::{cfg, due, key, MINUTE};
use common::{drain, open_fs, TaskMap, TestResult, START_MS};
use kairos::{Config, Due, Engine, ManualClock};
use kairos_wal::FsStorage;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

fn config() -> Config {
    let mut c = cfg();
    c.retry.max_attempts = 1;
    c
}

fn at(ms: u64) -> Due {
    Due::At(UNIX_EPOCH + Duration::from_millis(ms))
}

/// Overflow file `n`.
fn overflow_file(dir: &Path, n: u32) -> PathBuf {
    dir.join("overflow").join(kairos::overflow::file_name(n))
}

/// The entries of overflow file `n`: key → (offset, task id).
fn entries(dir: &Path, n: u32) -> TestResult<BTreeMap<Vec<u8>, (u64, u64)>> {
    Ok(
        kairos::overflow::read_file(&FsStorage, &overflow_file(dir, n), None, Some(n))?
            .into_iter()
            .map(|(offset, e)| (e.key.to_vec(), (offset, e.task_id)))
            .collect(),
    )
}

/// Every file under `dir`, with its bytes.
fn tree_bytes(dir: &Path) -> TestResult<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p)?);
            }
        }
    }
    Ok(out)
}

/// Far tasks `0..n` (due 2 h + i min) made far by one checkpoint (overflow file 1), then
/// `cancelled` cancelled; shut down cleanly. Returns what must fire.
fn far_dir(dir: &Path, n: usize, cancelled: &[usize]) -> TestResult<TaskMap> {
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(dir, config(), &clock)?;
    let mut model = TaskMap::new();
    for i in 0..n {
        let payload = format!("payload {i}").into_bytes();
        engine.schedule(&key(i), at(due(i)), &payload)?;
        model.insert(key(i), (due(i), payload));
    }
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, n);
    for &i in cancelled {
        assert!(engine.cancel(&key(i))?.is_cancelled());
        model.remove(&key(i));
    }
    engine.shutdown()?;
    Ok(model)
}

/// Opens the engine at `at_ms`, runs the clock to `until_ms` acking everything; returns what
/// fired (checking nothing fires twice) and shuts down cleanly.
fn fire(dir: &Path, at_ms: u64, until_ms: u64) -> TestResult<TaskMap> {
    let clock = ManualClock::new(at_ms);
    let engine = open_fs(dir, config(), &clock)?;
    let fired = fire_on(&engine, &clock, until_ms)?;
    engine.shutdown()?;
    Ok(fired)
}

fn fire_on(engine: &Engine, clock: &ManualClock, until_ms: u64) -> TestResult<TaskMap> {
    let mut fired = TaskMap::new();
    loop {
        for d in drain(engine)? {
            let again = fired.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
            assert!(
                again.is_none(),
                "twice: {:?}",
                String::from_utf8_lossy(d.key())
            );
            engine.consumer().ack(&d)?;
        }
        if let Some(cause) = common::far::poisoned(engine) {
            return Err(format!("poisoned: {cause}").into());
        }
        if clock.wall_ms() >= until_ms {
            return Ok(fired);
        }
        clock.advance(MINUTE);
    }
}

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
