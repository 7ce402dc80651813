//! Second review of overflow-damage handling: what `kairos verify` reports when the log is
//! damaged as well as an overflow entry, and what `kairos salvage` tells an operator.

#![cfg(feature = "cli")]

mod common;

use common::cli::{copy_tree, json, path, run};
use common::far::{far_dir, key, overflow_file};
use common::{open_fs, TestResult, START_MS};
use kairos::ManualClock;
use kairos_wal::FsStorage;
use std::path::{Path, PathBuf};

use common::far::cfg_one_attempt as config;

/// Flips a byte of the key in the overflow entry of far task `i`.
fn flip_far_key(dir: &Path, i: usize) -> TestResult {
    let file = overflow_file(dir, 1);
    let entries = kairos::overflow::read_file(&FsStorage, &file, None, Some(1))?;
    let (offset, _) = entries
        .iter()
        .find(|(_, e)| *e.key == *key(i))
        .ok_or("no entry")?;
    let mut bytes = std::fs::read(&file)?;
    bytes[*offset as usize + 30] ^= 0x20;
    std::fs::write(&file, &bytes)?;
    Ok(())
}

/// The log's only segment.
fn segment(dir: &Path) -> TestResult<PathBuf> {
    for entry in std::fs::read_dir(dir.join("wal"))? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "seg") {
            return Ok(p);
        }
    }
    Err("no segment".into())
}

/// A damaged log and a damaged overflow entry no task needs (its far task cancelled after
/// the checkpoint): the log's damage is what the engine's open refuses and what an operator
/// must be shown — `verify` must name the segment and its offset, not only the overflow
/// entry (which, judged alone, is a warning). Before the fix, the overflow entry's damage
/// replaced the log's as verify's error: verify named only the harmless overflow entry, and
/// `kairos salvage`, refusing the damaged log, pointed back at `kairos verify` "which names
/// this damage".
#[test]
fn verify_names_the_log_damage_when_an_unneeded_overflow_entry_is_damaged_too() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    far_dir(&built, 5, &[1])?;
    flip_far_key(&built, 1)?;
    let (stdout, _) = run(&["verify", path(&built)], 0);
    assert!(stdout.contains("WARNING: overflow file"), "{stdout}");

    let dir = tmp.path().join("data");
    copy_tree(&built, &dir)?;
    let seg = segment(&dir)?;
    let mut bytes = std::fs::read(&seg)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&seg, &bytes)?;
    assert!(open_fs(&dir, config(), &ManualClock::new(START_MS)).is_err());

    let (stdout, _) = run(&["verify", path(&dir), "--json"], 1);
    let v = json(&stdout);
    assert_eq!(
        v["error"]["file"].as_str(),
        Some(path(&seg)),
        "verify must name the damaged log: {v}"
    );
    let (stdout, stderr) = run(&["verify", path(&dir)], 1);
    assert!(
        stdout.contains(path(&seg)) && stderr.contains(path(&seg)),
        "{stdout}\n{stderr}"
    );
    // The overflow entry's damage is still shown.
    assert!(stdout.contains(path(&overflow_file(&dir, 1))), "{stdout}");
    // Salvage refuses, pointing at verify, which names the log's damage (above).
    let (_, stderr) = run(&["salvage", path(&dir)], 1);
    assert!(
        stderr.contains("kairos verify") && stderr.contains(path(&seg)),
        "{stderr}"
    );
    Ok(())
}

/// One far task's entry damaged: the listing names the file and offset once per entry, in the
/// singular, and points at `kairos dump` for the key (the far task's SCHEDULE record is still
/// in the log here, and dump prints it); `--discard` reports in the singular too.
#[test]
fn salvage_text_for_one_damaged_far_task() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    far_dir(&dir, 3, &[])?;
    flip_far_key(&dir, 2)?;
    let file = overflow_file(&dir, 1);
    let (stdout, _) = run(&["salvage", path(&dir)], 1);
    assert!(
        stdout.contains("1 overflow entry that live tasks"),
        "{stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("far task"))
        .ok_or("no far task line")?;
    assert_eq!(line.matches(path(&file)).count(), 1, "{line}");
    assert!(
        stdout.contains(&format!("kairos dump {}", path(&dir))),
        "{stdout}"
    );
    let (dump, _) = run(&["dump", path(&dir)], 1);
    assert!(dump.contains("key=\"far-0002\""), "{dump}");
    let (stdout, _) = run(&["salvage", path(&dir), "--discard"], 0);
    assert!(
        stdout.contains("1 task cancelled, 0 dead letters purged"),
        "{stdout}"
    );
    Ok(())
}
