//! `kairos salvage`: the tasks whose overflow entries are damaged are listed, and with
//! `--discard` cancelled (dead letters purged) so that the directory opens and every other
//! task is delivered, once, with its payload.

#![cfg(feature = "cli")]

mod common;

use common::cli::{copy_tree, json, path, run, tree_bytes};
use common::far::{at, due, key, overflow_file, MINUTE};
use common::{drain, open_fs, TaskMap, TestResult, START_MS};
use kairos::ManualClock;
use kairos_wal::FsStorage;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::far::cfg_one_attempt as config;

/// A data directory, shut down cleanly, holding in overflow file 1: ten far tasks
/// `far-0000..=far-0009` (due 2 h + i min; `far-0005` cancelled after the checkpoint), the
/// payloads of five near tasks `near-i` (due 10 + i min), and the payload of a dead letter
/// `dl` (one attempt, nacked after the checkpoint). Returns what must be delivered:
/// key → (due, payload).
fn build(dir: &Path) -> TestResult<TaskMap> {
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(dir, config(), &clock)?;
    let mut model = BTreeMap::new();
    for i in 0..10 {
        let payload = format!("payload {i}").into_bytes();
        engine.schedule(&key(i), at(due(i)), &payload)?;
        model.insert(key(i), (due(i), payload));
    }
    for i in 0..5u64 {
        let (k, due_ms, payload) = (
            format!("near-{i}").into_bytes(),
            START_MS + (10 + i) * 60_000,
            format!("near payload {i}").into_bytes(),
        );
        engine.schedule(&k, at(due_ms), &payload)?;
        model.insert(k, (due_ms, payload));
    }
    engine.schedule(b"dl", at(START_MS + 5 * 60_000), b"dead letter payload")?;
    let report = engine.checkpoint()?;
    assert_eq!(report.payloads_moved, 16, "{report:?}");
    assert_eq!(engine.stats().far, 10);
    assert!(engine.cancel(&key(5))?.is_cancelled());
    model.remove(&key(5));
    clock.advance(5 * MINUTE);
    let ds = drain(&engine)?;
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0].payload(), b"dead letter payload");
    engine.consumer().nack(&ds[0], None, "failed")?;
    assert_eq!(engine.dead_letters().len(), 1);
    engine.shutdown()?;
    Ok(model)
}

/// Flips a byte of the key of each entry of `keys` in overflow file 1; returns each entry's
/// offset and task id, by key.
fn damage(dir: &Path, keys: &[&[u8]]) -> TestResult<BTreeMap<Vec<u8>, (u64, u64)>> {
    let file = overflow_file(dir, 1);
    let entries = kairos::overflow::read_file(&FsStorage, &file, None, Some(1))?;
    let mut bytes = std::fs::read(&file)?;
    let mut out = BTreeMap::new();
    for k in keys {
        let (offset, e) = entries
            .iter()
            .find(|(_, e)| &*e.key == *k)
            .ok_or("no entry")?;
        bytes[*offset as usize + 30] ^= 0x20;
        out.insert(k.to_vec(), (*offset, e.task_id));
    }
    std::fs::write(&file, &bytes)?;
    Ok(out)
}

/// Every file of the log, with its bytes.
fn log_bytes(dir: &Path) -> TestResult<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir.join("wal"))? {
        let p = entry?.path();
        out.insert(p.clone(), std::fs::read(&p)?);
    }
    Ok(out)
}

#[test]
fn damaged_entries_are_listed_then_discarded_and_everything_else_is_delivered() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    let mut model = build(&built)?;
    // Nothing damaged: salvage says so, writes nothing, and passes.
    let (stdout, _) = run(&["salvage", path(&built)], 0);
    assert!(stdout.contains("damaged         none"), "{stdout}");

    let dir = tmp.path().join("data");
    copy_tree(&built, &dir)?;
    let far3 = key(3);
    let far5 = key(5);
    let hit = damage(&dir, &[&far3, &far5, b"near-2", b"dl"])?;

    // verify fails on damage a live task needs, and points at salvage.
    let (_, stderr) = run(&["verify", path(&dir)], 1);
    assert!(stderr.contains("kairos salvage"), "{stderr}");

    // The listing: what tasks need (far-0005's entry is dead: a warning); nothing written.
    let before = log_bytes(&dir)?;
    let (stdout, _) = run(&["salvage", path(&dir), "--json"], 1);
    let v = json(&stdout);
    let listed: Vec<(u64, String, u64)> = v["damaged"]
        .as_array()
        .ok_or("damaged")?
        .iter()
        .map(|d| {
            (
                d["task_id"].as_u64().unwrap_or(0),
                d["used_as"].as_str().unwrap_or("").to_string(),
                d["offset"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let mut want = vec![
        (hit[&far3].1, "far_task".to_string(), hit[&far3].0),
        (
            hit[&b"near-2".to_vec()].1,
            "payload".into(),
            hit[&b"near-2".to_vec()].0,
        ),
        (
            hit[&b"dl".to_vec()].1,
            "dead_letter".into(),
            hit[&b"dl".to_vec()].0,
        ),
    ];
    want.sort_by_key(|w| w.2);
    assert_eq!(listed, want, "{v}");
    let listed_as = |used_as: &str| {
        v["damaged"]
            .as_array()
            .and_then(|a| a.iter().find(|d| d["used_as"] == used_as))
            .map(|d| d["key"].clone())
    };
    assert_eq!(
        listed_as("far_task"),
        Some(serde_json::Value::Null),
        "a far task's key is only in its entry"
    );
    assert_eq!(listed_as("payload"), Some("near-2".into()));
    assert_eq!(listed_as("dead_letter"), Some("dl".into()));
    let warnings = v["warnings"].as_array().ok_or("warnings")?;
    assert!(
        warnings.is_empty(),
        "damage in a file tasks need is listed, not warned: {v}"
    );
    assert_eq!(v["discarded"], false);
    assert_eq!(log_bytes(&dir)?, before, "a listing writes nothing");
    let (stdout, _) = run(&["salvage", path(&dir)], 1);
    assert!(stdout.contains("--discard"), "{stdout}");
    assert!(stdout.contains("key \"near-2\""), "{stdout}");

    // An engine holding the directory: --discard is refused, nothing written.
    {
        let clock = ManualClock::new(START_MS);
        let _engine = open_fs(&dir, config(), &clock);
        let (_, stderr) = run(&["salvage", path(&dir), "--discard"], 1);
        assert!(stderr.contains("open in an engine"), "{stderr}");
    }
    assert_eq!(log_bytes(&dir)?.len(), before.len());

    // Discarded: two tasks cancelled, one dead letter purged; verify passes with a warning.
    let (stdout, _) = run(&["salvage", path(&dir), "--discard", "--json"], 0);
    let v = json(&stdout);
    assert_eq!(v["discarded"], true, "{v}");
    assert_eq!(v["tasks_cancelled"], 2, "{v}");
    assert_eq!(v["dead_letters_purged"], 1, "{v}");
    let (stdout, _) = run(&["verify", path(&dir)], 0);
    assert!(stdout.contains("WARNING: overflow file"), "{stdout}");
    let (stdout, _) = run(&["salvage", path(&dir)], 0);
    assert!(stdout.contains("damaged         none"), "{stdout}");
    assert!(stdout.contains("WARNING"), "{stdout}");

    // The engine opens, overdue far tasks and all: every other task once, with its payload.
    model.remove(&far3);
    model.remove(b"near-2".as_slice());
    let clock = ManualClock::new(START_MS + 3 * 3_600_000);
    let engine = open_fs(&dir, config(), &clock)?;
    assert!(engine.dead_letters().is_empty());
    let mut fired = BTreeMap::new();
    for d in drain(&engine)? {
        let again = fired.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
        assert!(again.is_none(), "twice: {:?}", d.key());
        engine.consumer().ack(&d)?;
    }
    assert_eq!(fired, model);
    assert_eq!(engine.stats().pending, 0);
    engine.checkpoint()?;
    engine.shutdown()?;
    run(&["verify", path(&dir)], 0);
    Ok(())
}

/// A missing overflow file: the tasks that need it are listed and discarded; the directory
/// opens (the checkpoint names the file, but no live task needs it any more).
#[test]
fn a_missing_overflow_file_is_salvaged_by_discarding_the_tasks_that_need_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir)?;
    std::fs::remove_file(overflow_file(&dir, 1))?;
    let clock = ManualClock::new(START_MS);
    assert!(open_fs(&dir, config(), &clock).is_err());
    let (stdout, _) = run(&["salvage", path(&dir), "--json"], 1);
    // Nine far tasks, five payloads, one dead letter.
    assert_eq!(json(&stdout)["damaged"].as_array().map(Vec::len), Some(15));
    let (stdout, _) = run(&["salvage", path(&dir), "--discard", "--json"], 0);
    let v = json(&stdout);
    assert_eq!(
        (
            v["tasks_cancelled"].as_u64(),
            v["dead_letters_purged"].as_u64()
        ),
        (Some(14), Some(1))
    );
    let engine = open_fs(&dir, config(), &clock)?;
    assert_eq!(engine.stats().pending, 0);
    engine.shutdown()?;
    run(&["verify", path(&dir)], 0);
    Ok(())
}

/// What salvage cannot mend it refuses, writing nothing: a damaged log, a directory that is
/// not a data directory.
#[test]
fn salvage_refuses_what_it_cannot_mend() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir)?;
    // Not a data directory.
    let (_, stderr) = run(&["salvage", path(&dir.join("overflow"))], 1);
    assert!(stderr.contains("not a Kairos data directory"), "{stderr}");
    // A flipped byte in the middle of the log's (only, sealed-by-close) segment.
    let seg = log_bytes(&dir)?
        .into_keys()
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .ok_or("segment")?;
    let mut bytes = std::fs::read(&seg)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&seg, &bytes)?;
    let before = log_bytes(&dir)?;
    for discard in [false, true] {
        let mut args = vec!["salvage", path(&dir)];
        if discard {
            args.push("--discard");
        }
        let (_, stderr) = run(&args, 1);
        assert!(stderr.contains("kairos verify"), "{stderr}");
    }
    assert_eq!(log_bytes(&dir)?, before);
    Ok(())
}

/// A data directory at `dir` whose log alone holds `keys` (due 10 s after `START_MS`, payload
/// `payload`; no checkpoint taken), shut down cleanly or, if not `clean`, dropped (a crash as
/// far as the log knows).
fn log_only(dir: &Path, keys: impl IntoIterator<Item = Vec<u8>>, clean: bool) -> TestResult {
    let engine = open_fs(dir, config(), &ManualClock::new(START_MS))?;
    for k in keys {
        engine.schedule(&k, at(START_MS + 10_000), b"payload")?;
    }
    if clean {
        engine.shutdown()?;
    } else {
        drop(engine);
    }
    let checkpoints = dir.join("checkpoint");
    assert!(!checkpoints.exists() || std::fs::read_dir(&checkpoints)?.next().is_none());
    Ok(())
}

/// Without a checkpoint (no overflow file in use) salvage still reads the log, as the open
/// would: a damaged one is refused as it is with a checkpoint, not called sound (it used to
/// answer "damaged none" with exit status 0 for a log `kairos verify` fails).
#[test]
fn salvage_without_a_checkpoint_still_refuses_a_damaged_log() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    log_only(&dir, (0..50).map(key), true)?;
    // Sound, it passes.
    let (stdout, _) = run(&["salvage", path(&dir)], 0);
    assert!(stdout.contains("damaged         none"), "{stdout}");
    let seg = log_bytes(&dir)?
        .into_keys()
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .ok_or("segment")?;
    let mut bytes = std::fs::read(&seg)?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&seg, &bytes)?;
    run(&["verify", path(&dir)], 1);
    let before = log_bytes(&dir)?;
    for discard in [false, true] {
        let mut args = vec!["salvage", path(&dir)];
        if discard {
            args.push("--discard");
        }
        let (stdout, stderr) = run(&args, 1);
        assert!(!stdout.contains("damaged         none"), "{stdout}");
        assert!(stderr.contains("corrupt log"), "{stderr}");
        assert!(stderr.contains("kairos verify"), "{stderr}");
    }
    assert_eq!(log_bytes(&dir)?, before, "nothing written");
    Ok(())
}

/// `dump --key` reads the entry of each far task whose key hash matches: when that entry is
/// damaged but its task finished after the checkpoint (`far-0005`, cancelled), nothing needs
/// it — `verify` and a plain `dump` warn and pass, the engine opens — so `dump --key` warns
/// and passes too (it used to fail, exit status 1, "damaged overflow file", on a directory
/// the other tools pass: the state `salvage --discard` leaves). A damaged entry a live task
/// needs still fails it (on a copy of the directory).
#[test]
fn dump_key_warns_for_a_damaged_entry_no_live_task_needs() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir)?;
    let live_damaged = tmp.path().join("live");
    copy_tree(&dir, &live_damaged)?;
    damage(&dir, &[&key(5)])?;
    let (stdout, stderr) = run(&["verify", path(&dir)], 0);
    let said = format!("{stdout}{stderr}").to_lowercase();
    assert!(said.contains("warning"), "{said}");
    run(&["dump", path(&dir)], 0);
    let cancelled = String::from_utf8(key(5))?;
    let (stdout, stderr) = run(&["dump", "--key", &cancelled, path(&dir)], 0);
    assert!(stdout.contains("CANCEL"), "{stdout}");
    assert!(
        stderr.contains("kairos dump: warning: cannot read the overflow entry of far task")
            && stderr.contains("shown only if a record still in the log names it with the key"),
        "{stderr}"
    );
    assert!(!stderr.contains("damaged overflow file"), "{stderr}");

    // A live far task's entry damaged too: `--key` naming it fails, as verify does.
    damage(&live_damaged, &[&key(3)])?;
    run(&["verify", path(&live_damaged)], 1);
    let live = String::from_utf8(key(3))?;
    let (_, stderr) = run(&["dump", "--key", &live, path(&live_damaged)], 1);
    assert!(stderr.contains("damaged overflow file"), "{stderr}");
    Ok(())
}

/// Without a checkpoint, a torn tail an unclean close left (the last frame cut short) is what
/// the engine's open truncates: `kairos verify` passes it (a warning), and so does salvage —
/// it is not damage salvage must refuse, nor is it called damaged.
#[test]
fn salvage_without_a_checkpoint_passes_a_torn_tail_as_verify_does() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    log_only(&dir, (0..50).map(key), false)?;
    let seg = log_bytes(&dir)?
        .into_keys()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .max()
        .ok_or("segment")?;
    let mut bytes = std::fs::read(&seg)?;
    bytes.extend(std::iter::repeat_n(0xA5u8, 100));
    std::fs::write(&seg, &bytes)?;
    let (vout, verr) = run(&["verify", path(&dir)], 0);
    let (stdout, stderr) = run(&["salvage", path(&dir)], 0);
    assert!(
        stdout.contains("damaged         none"),
        "{stdout}\n{stderr}\n{vout}\n{verr}"
    );
    let (stdout, stderr) = run(&["salvage", path(&dir), "--discard"], 0);
    assert!(
        stdout.contains("damaged         none"),
        "{stdout}\n{stderr}"
    );
    // The engine opens it (truncating the tail), every task there.
    let engine = open_fs(&dir, config(), &ManualClock::new(START_MS))?;
    assert_eq!(engine.stats().pending, 50);
    engine.shutdown()?;
    Ok(())
}

/// A log of one record: `verify`'s segment line and `dump`'s summary say "1 record", as the
/// other counts of these tools do since they share one plural helper (they said "1 records").
#[test]
fn one_record_is_counted_in_the_singular() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    log_only(&dir, [key(0)], true)?;
    let (stdout, _) = run(&["verify", path(&dir)], 0);
    assert!(stdout.contains(" 1 record, "), "{stdout}");
    assert!(!stdout.contains("1 records"), "{stdout}");
    let (_, stderr) = run(&["dump", path(&dir)], 0);
    assert!(stderr.contains("kairos dump: 1 record, "), "{stderr}");
    assert!(stderr.contains("in 1 segment of"), "{stderr}");
    let (_, stderr) = run(&["dump", path(&dir), "--key", "nobody"], 0);
    assert!(stderr.contains("0 of 1 record shown"), "{stderr}");
    Ok(())
}

/// `dump --key` with a key that begins with '-': `--key=-x` finds its task, and the help says
/// so — `--key -x` is refused as an unknown option (clap's tip, "use '-- -x'", does not work
/// for an option's value), while since every option takes negative numbers `--key -5` is the
/// key "-5": which of the two a key beginning with '-' gets was not said anywhere.
#[test]
fn dump_key_beginning_with_a_hyphen() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    log_only(&dir, [b"-x".to_vec(), b"-5".to_vec()], true)?;
    for key in ["-x", "-5"] {
        let (_, stderr) = run(&["dump", path(&dir), &format!("--key={key}")], 0);
        assert!(stderr.contains("1 of 2 records shown"), "{key}: {stderr}");
    }
    let (_, stderr) = run(&["dump", path(&dir), "--key", "-5"], 0);
    assert!(stderr.contains("1 of 2 records shown"), "{stderr}");
    let (_, stderr) = run(&["dump", path(&dir), "--key", "-x"], 2);
    assert!(stderr.contains("unexpected argument '-x'"), "{stderr}");
    let (help, _) = run(&["dump", "--help"], 0);
    assert!(help.contains("--key=-x"), "{help}");
    Ok(())
}

/// A directory holding only an empty `wal/`: `verify` fails ("no log segments … not a Kairos
/// data or log directory"), and so does salvage, with and without `--discard`, writing
/// nothing — it answered "damaged none", exit 0 (found by a review). A data directory whose
/// log's creation was cut short (its LOCK there, `wal/` empty) passes both, as the engine
/// opens it.
#[test]
fn salvage_refuses_a_log_directory_without_segments_as_verify_does() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    std::fs::create_dir_all(dir.join("wal"))?;
    let (stdout, _) = run(&["verify", path(&dir)], 1);
    assert!(stdout.contains("no log segments"), "{stdout}");
    let before = tree_bytes(&dir)?;
    for discard in [false, true] {
        let mut args = vec!["salvage", path(&dir)];
        if discard {
            args.push("--discard");
        }
        let (stdout, stderr) = run(&args, 1);
        assert!(!stdout.contains("damaged         none"), "{stdout}");
        assert!(stderr.contains("no log segments"), "{stderr}");
    }
    assert!(tree_bytes(&dir)? == before, "nothing written");

    let cut = tmp.path().join("cut");
    let engine = open_fs(&cut, config(), &ManualClock::new(START_MS))?;
    engine.shutdown()?;
    for file in std::fs::read_dir(cut.join("wal"))? {
        std::fs::remove_file(file?.path())?;
    }
    run(&["verify", path(&cut)], 0);
    run(&["salvage", path(&cut)], 0);
    assert!(open_fs(&cut, config(), &ManualClock::new(START_MS))?
        .shutdown()
        .is_ok());
    Ok(())
}
