//! Review of commit 9c921c9: the replay holds a far task whose overflow entry a record after
//! the checkpoint needs (DELIVER, RESCHEDULE, …) and that does not read back by id
//! (`Unresolved`) until the end of the log; the open fails only if it is still live or a dead
//! letter then, and `verify` / `inspect` / `dump` / `salvage` judge it alike. Each test damages
//! the entry of a far task after a sequence of records naming it, and checks the engine's
//! verdict against the tools' — and, when the engine opens, that every other task fires
//! exactly once with its payload.

#![cfg(feature = "cli")]

mod common;

use common::cli::{json, path, run, tree_bytes};
use common::far::{
    at, cfg, cfg_one_attempt, due, far_dir, fire_dir as fire, fire_on, key,
    overflow_entries as entries, overflow_file, MINUTE,
};
use common::{drain, open_fs, TaskMap, TestResult, START_MS};
use kairos::{Engine, ManualClock};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Where to damage an entry.
#[derive(Clone, Copy, Debug)]
enum Spot {
    /// A byte of its key: the CRC fails, its length still leads to the next entry.
    Key,
    /// A byte of its length field: nothing says where the next entry begins.
    Length,
}

/// Damages the entry of each key in `keys` in overflow file `n` (all found before any is
/// damaged); returns (offset, task id) of each, in the order given.
fn damage(dir: &Path, n: u32, keys: &[(Vec<u8>, Spot)]) -> TestResult<Vec<(u64, u64)>> {
    let found = entries(dir, n)?;
    let file = overflow_file(dir, n);
    let mut bytes = std::fs::read(&file)?;
    let mut out = Vec::new();
    for (k, spot) in keys {
        let (offset, id) = *found.get(k).ok_or("no such entry")?;
        let at = match spot {
            Spot::Key => offset as usize + 30,
            Spot::Length => offset as usize + 1,
        };
        bytes[at] ^= 0x40;
        out.push((offset, id));
    }
    std::fs::write(&file, &bytes)?;
    Ok(out)
}

/// `salvage --json`: (task id, used_as) of each listed entry, sorted.
fn listed(dir: &Path, status: i32) -> TestResult<Vec<(u64, String)>> {
    let (stdout, _) = run(&["salvage", path(dir), "--json"], status);
    let v = json(&stdout);
    let mut out: Vec<(u64, String)> = v["damaged"]
        .as_array()
        .ok_or("damaged")?
        .iter()
        .filter_map(|d| Some((d["task_id"].as_u64()?, d["used_as"].as_str()?.to_string())))
        .collect();
    out.sort();
    Ok(out)
}

/// The open's error, or "" if it opens (the engine is then shut down).
fn open_error(dir: &Path) -> String {
    match open_fs(dir, cfg_one_attempt(), &ManualClock::new(START_MS)) {
        Ok(engine) => {
            let _ = engine.shutdown();
            String::new()
        }
        Err(e) => e.to_string(),
    }
}

/// A directory that should open: the engine opens it, `verify`, `inspect`, `dump` pass (with a
/// warning), salvage lists nothing and `--discard` writes not a byte.
fn assert_opens_and_tools_agree(dir: &Path) -> TestResult {
    assert_eq!(open_error(dir), "", "the engine refuses {}", dir.display());
    for tool in ["verify", "inspect", "dump"] {
        let (stdout, stderr) = run(&[tool, path(dir)], 0);
        assert!(
            format!("{stdout}{stderr}")
                .to_lowercase()
                .contains("warning"),
            "{tool} says nothing of the damage: {stdout}{stderr}"
        );
    }
    assert_eq!(listed(dir, 0)?, []);
    let bytes = tree_bytes(dir)?;
    run(&["salvage", path(dir)], 0);
    run(&["salvage", path(dir), "--discard"], 0);
    assert!(
        tree_bytes(dir)? == bytes,
        "salvage wrote to {}",
        dir.display()
    );
    Ok(())
}

/// A directory that should not open: the engine refuses naming `id` and salvage; every tool
/// fails (exit 1) and mentions salvage; salvage lists exactly `expected` and writes nothing
/// without `--discard`.
fn assert_refused_and_tools_agree(dir: &Path, id: u64, expected: &[(u64, &str)]) -> TestResult {
    let refused = open_error(dir);
    assert!(
        refused.contains(&format!("far task {id}")) && refused.contains("kairos salvage"),
        "{refused}"
    );
    for tool in ["verify", "inspect", "dump"] {
        let (stdout, stderr) = run(&[tool, path(dir)], 1);
        assert!(
            format!("{stdout}{stderr}").contains("salvage"),
            "{tool}: {stdout}{stderr}"
        );
    }
    let bytes = tree_bytes(dir)?;
    let want: Vec<(u64, String)> = expected.iter().map(|(i, u)| (*i, u.to_string())).collect();
    assert_eq!(listed(dir, 1)?, want);
    assert!(tree_bytes(dir)? == bytes, "salvage without --discard wrote");
    Ok(())
}

/// An engine opened at `at_ms` on `dir` with `config`, with its clock.
fn engine_at(dir: &Path, config: kairos::Config, at_ms: u64) -> TestResult<(Engine, ManualClock)> {
    let clock = ManualClock::new(at_ms);
    let engine = open_fs(dir, config, &clock)?;
    Ok((engine, clock))
}

/// Runs the clock of `engine` a minute at a time until something is delivered (at most
/// `minutes` minutes); returns the deliveries.
fn next_deliveries(
    engine: &Engine,
    clock: &ManualClock,
    minutes: u32,
) -> TestResult<Vec<kairos::Delivery>> {
    for _ in 0..minutes {
        let ds = drain(engine)?;
        if !ds.is_empty() {
            return Ok(ds);
        }
        clock.advance(MINUTE);
    }
    Err("nothing delivered".into())
}

/// DELIVER → RETRY (nack) → DELIVER → ACK of far task 0, then its entry damaged: the task is
/// finished, so the directory opens; every tool agrees; the four others fire once.
#[test]
fn nack_redeliver_ack_then_damage_opens() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 5;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        assert_eq!(ds.len(), 1);
        engine.consumer().nack(&ds[0], Some(MINUTE), "try again")?;
        // Task 1 comes due in the same minute as task 0's second attempt.
        let ds = next_deliveries(&engine, &clock, 10)?;
        let again = ds.iter().find(|d| d.key() == &key(0)[..]).ok_or("task 0")?;
        assert_eq!(again.attempt(), 2);
        for d in &ds {
            engine.consumer().ack(d)?;
            model.remove(d.key());
        }
        engine.shutdown()?;
    }
    damage(&dir, 1, &[(key(0), Spot::Key)])?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, due(0), due(n + 2))?, model);
    Ok(())
}

/// DELIVER → RETRY (nack) of far task 0 and no second delivery yet: the task is live, its key
/// only in the damaged entry. The open fails naming it; salvage lists it as a far task and
/// `--discard` cancels it; then the four others fire once.
#[test]
fn nacked_and_waiting_far_task_with_a_damaged_entry_is_salvaged() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 5;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine
            .consumer()
            .nack(&ds[0], Some(Duration::from_secs(3600)), "later")?;
        engine.shutdown()?;
    }
    model.remove(&key(0));
    let got = damage(&dir, 1, &[(key(0), Spot::Key)])?;
    let id = got[0].1;
    assert_refused_and_tools_agree(&dir, id, &[(id, "far_task")])?;
    run(&["salvage", path(&dir), "--discard"], 0);
    run(&["verify", path(&dir)], 0);
    assert_eq!(fire(&dir, due(0), due(n + 2) + 3_600_000)?, model);
    Ok(())
}

/// DELIVER → DEAD (one attempt, nacked) of far task 0, the dead letter left, its entry then
/// damaged: the dead letter's payload is in the entry, so the open fails naming it; salvage
/// must list it as a dead letter and `--discard` must PURGE it (not CANCEL: a CANCEL of a dead
/// letter breaks the replay rules).
#[test]
fn dead_letter_of_a_damaged_far_task_is_purged_by_salvage() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 5;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().nack(&ds[0], None, "fatal")?;
        assert_eq!(engine.dead_letters().len(), 1);
        engine.shutdown()?;
    }
    model.remove(&key(0));
    let got = damage(&dir, 1, &[(key(0), Spot::Key)])?;
    let id = got[0].1;
    assert_refused_and_tools_agree(&dir, id, &[(id, "dead_letter")])?;
    let (stdout, _) = run(&["salvage", path(&dir), "--discard", "--json"], 0);
    let v = json(&stdout);
    assert_eq!(v["dead_letters_purged"].as_u64(), Some(1), "{v}");
    run(&["verify", path(&dir)], 0);
    let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0))?;
    assert_eq!(engine.dead_letters().len(), 0);
    assert_eq!(fire_on(&engine, &clock, due(n + 2))?, model);
    engine.shutdown()?;
    Ok(())
}

/// DELIVER → DEAD → PURGE (the application purged the dead letter), then damage: finished,
/// the directory opens. And DELIVER → DEAD → requeue (PURGE + SCHEDULE of a new task with the
/// dead letter's key and payload), then damage: the requeued task fires once with the
/// original payload.
#[test]
fn dead_letter_purged_or_requeued_then_damage_opens() -> TestResult {
    for requeue in [false, true] {
        let tmp = tempfile::tempdir()?;
        let dir = tmp.path().join("data");
        let n = 5;
        let mut model = far_dir(&dir, n, &[])?;
        {
            let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
            let ds = next_deliveries(&engine, &clock, 40)?;
            engine.consumer().nack(&ds[0], None, "fatal")?;
            let dead = engine.dead_letters();
            assert_eq!(dead.len(), 1);
            if requeue {
                engine.requeue_dead_letter(dead[0].task_id, at(due(0) + 10 * 60_000))?;
            } else {
                assert!(engine.purge_dead_letter(dead[0].task_id)?);
            }
            engine.shutdown()?;
        }
        if requeue {
            model.insert(key(0), (due(0) + 10 * 60_000, b"payload 0".to_vec()));
        } else {
            model.remove(&key(0));
        }
        damage(&dir, 1, &[(key(0), Spot::Key)])?;
        assert_opens_and_tools_agree(&dir)?;
        assert_eq!(fire(&dir, due(0), due(n + 12))?, model, "requeue {requeue}");
    }
    Ok(())
}

/// RESCHEDULE without a new payload then fired and ACKed; RESCHEDULE with a new payload then
/// CANCELled; RESCHEDULE (still far) then CANCELled: each finished, entries damaged, the
/// directory opens and the others fire once.
#[test]
fn rescheduled_then_finished_far_tasks_with_damaged_entries_open() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 6;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), START_MS)?;
        engine.reschedule(&key(1), at(START_MS + 5 * 60_000), None)?;
        engine.reschedule(&key(2), at(START_MS + 20 * 60_000), Some(b"new 2"))?;
        engine.reschedule(&key(3), at(due(n + 3)), None)?;
        let ds = next_deliveries(&engine, &clock, 10)?;
        assert_eq!(ds.len(), 1);
        assert_eq!(
            (ds[0].key(), ds[0].payload()),
            (&key(1)[..], &b"payload 1"[..])
        );
        engine.consumer().ack(&ds[0])?;
        assert!(engine.cancel(&key(2))?.is_cancelled());
        assert!(engine.cancel(&key(3))?.is_cancelled());
        engine.shutdown()?;
    }
    for i in [1, 2, 3] {
        model.remove(&key(i));
    }
    damage(
        &dir,
        1,
        &[
            (key(1), Spot::Key),
            (key(2), Spot::Key),
            (key(3), Spot::Key),
        ],
    )?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, START_MS + 6 * 60_000, due(n + 4))?, model);
    Ok(())
}

/// RESCHEDULE with a new payload (the key still only in the old, damaged entry), then fired
/// and ACKed: finished — opens, the new payload was the one delivered.
#[test]
fn rescheduled_with_payload_fired_and_acked_then_damage_opens() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 4;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), START_MS)?;
        engine.reschedule(&key(2), at(START_MS + 5 * 60_000), Some(b"new 2"))?;
        let ds = next_deliveries(&engine, &clock, 10)?;
        assert_eq!((ds[0].key(), ds[0].payload()), (&key(2)[..], &b"new 2"[..]));
        engine.consumer().ack(&ds[0])?;
        engine.shutdown()?;
    }
    model.remove(&key(2));
    damage(&dir, 1, &[(key(2), Spot::Key)])?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, START_MS + 6 * 60_000, due(n + 2))?, model);
    Ok(())
}

/// Several far tasks of one file, each with a damaged entry, left in every state: 0 acked
/// (finished), 1 in flight at a crash (live), 2 a dead letter, 3 cancelled while in flight
/// (finished), 5 never named after the checkpoint (still far), and 4, 6, 7 untouched, whole.
/// The open fails; salvage lists exactly 1 and 5 as far tasks and 2 as a dead letter; after
/// `--discard` the untouched ones fire once and nothing else does.
#[test]
fn many_far_tasks_in_one_damaged_file_in_every_state() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 8;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        // 0, 1, 2, 3 come due one minute apart.
        let mut got = BTreeMap::new();
        while got.len() < 4 {
            for d in next_deliveries(&engine, &clock, 40)? {
                got.insert(d.key().to_vec(), d);
            }
        }
        engine.consumer().ack(&got[&key(0)])?;
        engine.consumer().nack(&got[&key(2)], None, "fatal")?;
        assert!(matches!(
            engine.cancel(&key(3))?,
            kairos::CancelOutcome::AlreadyDelivered { .. }
        ));
        drop(got);
        drop(engine); // a crash: 1 stays in flight
    }
    for i in [0, 1, 2, 3, 5] {
        model.remove(&key(i));
    }
    let spots: Vec<_> = [0, 1, 2, 3, 5]
        .iter()
        .map(|&i| (key(i), Spot::Key))
        .collect();
    let ids: Vec<u64> = damage(&dir, 1, &spots)?.iter().map(|d| d.1).collect();
    assert_refused_and_tools_agree(
        &dir,
        ids[1],
        &[
            (ids[1], "far_task"),
            (ids[2], "dead_letter"),
            (ids[4], "far_task"),
        ],
    )?;
    run(&["salvage", path(&dir), "--discard"], 0);
    run(&["verify", path(&dir)], 0);
    let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0))?;
    assert_eq!(engine.dead_letters().len(), 0);
    assert_eq!(fire_on(&engine, &clock, due(n + 2))?, model);
    engine.shutdown()?;
    Ok(())
}

/// A fired and acked far task whose entry's *length* is damaged (the next entry's start
/// unknown), with live far tasks after it in the file: the open's promotion must go past it
/// to them; the directory opens, the tools agree, every other far task fires once.
#[test]
fn damaged_length_of_a_fired_far_tasks_entry_opens() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 6;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().ack(&ds[0])?;
        engine.shutdown()?;
    }
    model.remove(&key(0));
    damage(&dir, 1, &[(key(0), Spot::Length)])?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, due(0), due(n + 2))?, model);
    Ok(())
}

/// The same with the length damaged in the middle of the file (task 2 of 6), reopened long
/// before any is due (the promotion at open reads nothing) and then run.
#[test]
fn damaged_length_in_the_middle_of_the_file_opens_and_promotes_past_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 6;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), START_MS)?;
        engine.reschedule(&key(2), at(START_MS + 5 * 60_000), None)?;
        let ds = next_deliveries(&engine, &clock, 10)?;
        engine.consumer().ack(&ds[0])?;
        engine.shutdown()?;
    }
    model.remove(&key(2));
    damage(&dir, 1, &[(key(2), Spot::Length)])?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, START_MS + 6 * 60_000, due(n + 2))?, model);
    Ok(())
}

/// The overflow file removed: with every far task in it fired and acked (or cancelled), the
/// directory opens; with one still far in it, the open fails naming that one (not the acked
/// one), salvage lists exactly it, and `--discard` makes the directory open.
#[test]
fn a_missing_overflow_file() -> TestResult {
    let tmp = tempfile::tempdir()?;
    // All finished.
    let dir = tmp.path().join("all");
    let n = 2;
    far_dir(&dir, n, &[1])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().ack(&ds[0])?;
        engine.shutdown()?;
    }
    std::fs::remove_file(overflow_file(&dir, 1))?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, due(0), due(n + 2))?, TaskMap::new());

    // One still far.
    let dir = tmp.path().join("one");
    let n = 3;
    let mut model = far_dir(&dir, n, &[])?;
    let ids = entries(&dir, 1)?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().ack(&ds[0])?;
        assert!(engine.cancel(&key(2))?.is_cancelled());
        engine.shutdown()?;
    }
    std::fs::remove_file(overflow_file(&dir, 1))?;
    let live = ids[&key(1)].1;
    // (The open's refusal is the older check of a missing file a live task needs: it names
    // the file, not the task.)
    assert_ne!(open_error(&dir), "");
    assert_eq!(listed(&dir, 1)?, [(live, "far_task".to_string())]);
    run(&["salvage", path(&dir), "--discard"], 0);
    model.clear();
    assert_eq!(fire(&dir, due(0), due(n + 2))?, model);
    Ok(())
}

/// Damage in an overflow file that also holds near tasks' payloads (due within the horizon,
/// beyond the payload window): the fired far task's entry damaged, the near tasks' payloads
/// whole — the directory opens and the near tasks fire with their payloads.
#[test]
fn damage_in_a_file_shared_with_near_tasks_payloads() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(&dir, cfg_one_attempt(), &clock)?;
    let mut model = TaskMap::new();
    for i in 0..3 {
        let payload = format!("payload {i}").into_bytes();
        engine.schedule(&key(i), at(due(i)), &payload)?;
        model.insert(key(i), (due(i), payload));
    }
    for i in 0..3 {
        let k = format!("near-{i}").into_bytes();
        let due_ms = START_MS + (30 + i as u64) * 60_000;
        let payload = format!("near payload {i}").into_bytes();
        engine.schedule(&k, at(due_ms), &payload)?;
        model.insert(k, (due_ms, payload));
    }
    engine.checkpoint()?;
    assert_eq!(engine.stats().far, 3);
    engine.reschedule(&key(0), at(START_MS + 5 * 60_000), None)?;
    let ds = next_deliveries(&engine, &clock, 10)?;
    assert_eq!(ds[0].key(), &key(0)[..]);
    engine.consumer().ack(&ds[0])?;
    engine.shutdown()?;
    model.remove(&key(0));
    let all = entries(&dir, 1)?;
    assert!(all.contains_key(&b"near-0"[..]), "near payloads in file 1");
    damage(&dir, 1, &[(key(0), Spot::Key)])?;
    assert_opens_and_tools_agree(&dir)?;
    assert_eq!(fire(&dir, START_MS + 6 * 60_000, due(5))?, model);
    Ok(())
}

/// After a reopen past a finished far task's damaged entry: checkpoints and reopens, again and
/// again — the finished task never resurfaces, the damage stays a warning while the file is
/// named and goes with it, and every other task fires exactly once.
#[test]
fn checkpoints_after_the_reopen_do_not_bring_anything_back() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 5;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().ack(&ds[0])?;
        engine.shutdown()?;
    }
    model.remove(&key(0));
    damage(&dir, 1, &[(key(0), Spot::Key)])?;
    let mut fired = TaskMap::new();
    let mut now = due(0);
    for round in 0..4 {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), now)?;
        assert_eq!(
            engine.stats().pending,
            model.len() - fired.len(),
            "round {round}"
        );
        engine.checkpoint()?;
        // One more minute's worth fires each round.
        for (k, v) in fire_on(&engine, &clock, now + MINUTE.as_millis() as u64)? {
            assert!(fired.insert(k.clone(), v).is_none(), "{k:?} twice");
        }
        engine.checkpoint()?;
        now = clock.wall_ms();
        engine.shutdown()?;
        run(&["verify", path(&dir)], 0);
        assert_eq!(listed(&dir, 0)?, []);
    }
    for (k, v) in fire(&dir, now, due(n + 2))? {
        assert!(fired.insert(k.clone(), v).is_none(), "{k:?} twice");
    }
    assert_eq!(fired, model);
    // Everything fired, a checkpoint taken: no file names the damaged entry any more.
    let (engine, _clock) = engine_at(&dir, cfg_one_attempt(), due(n + 2))?;
    engine.checkpoint()?;
    engine.shutdown()?;
    let (stdout, stderr) = run(&["verify", path(&dir)], 0);
    assert!(
        !format!("{stdout}{stderr}")
            .to_lowercase()
            .contains("warning"),
        "{stdout}{stderr}"
    );
    Ok(())
}

/// The key rule: far task 0 fired and acked, its key scheduled again (a new task), the old
/// entry then damaged. After the reopen the key is live once: a schedule of it is refused, a
/// cancel cancels the new task, and the key is free after that.
#[test]
fn a_finished_far_tasks_key_scheduled_again() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 3;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().ack(&ds[0])?;
        engine.schedule(&key(0), at(due(0) + 30 * 60_000), b"again")?;
        engine.shutdown()?;
    }
    damage(&dir, 1, &[(key(0), Spot::Key)])?;
    assert_opens_and_tools_agree(&dir)?;
    model.insert(key(0), (due(0) + 30 * 60_000, b"again".to_vec()));
    let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0))?;
    assert!(engine.schedule(&key(0), at(due(9)), b"dup").is_err());
    engine.shutdown()?;
    // Reopened: the new task fires once, with its payload.
    let clock2 = ManualClock::new(clock.wall_ms());
    let engine = open_fs(&dir, cfg_one_attempt(), &clock2)?;
    assert_eq!(fire_on(&engine, &clock2, due(n + 40))?, model);
    engine.shutdown()?;
    Ok(())
}

/// A far task delivered and in flight, its key scheduled again after a cancel answered
/// `AlreadyDelivered` (the key is free then), the old entry damaged, and a crash: the held
/// task is finished (the CANCEL), the new task live — the open serves the new task only.
#[test]
fn cancelled_in_flight_then_key_reused_then_crash() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 3;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        assert!(matches!(
            engine.cancel(&key(0))?,
            kairos::CancelOutcome::AlreadyDelivered { .. }
        ));
        engine.schedule(&key(0), at(due(0) + 30 * 60_000), b"again")?;
        drop(ds);
        drop(engine); // crash
    }
    damage(&dir, 1, &[(key(0), Spot::Key)])?;
    assert_opens_and_tools_agree(&dir)?;
    model.insert(key(0), (due(0) + 30 * 60_000, b"again".to_vec()));
    assert_eq!(fire(&dir, due(0), due(n + 40))?, model);
    Ok(())
}

/// The open's error for a far task still in flight names the task, the file and the offset,
/// and says what to do; it does not repeat itself.
#[test]
fn the_open_error_names_task_file_offset_and_what_to_do() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    far_dir(&dir, 3, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        drop(ds);
        drop(engine);
    }
    let got = damage(&dir, 1, &[(key(0), Spot::Key)])?;
    let (offset, id) = got[0];
    let refused = open_error(&dir);
    let file = overflow_file(&dir, 1);
    for part in [
        format!("far task {id}"),
        format!("{}", file.display()),
        format!("offset {offset}"),
        "kairos salvage".to_string(),
        "--discard".to_string(),
    ] {
        assert!(refused.contains(&part), "{part:?} not in: {refused}");
    }
    Ok(())
}

/// An entry that cannot be *read* (EIO) of a far task fired and acked after the checkpoint:
/// the engine's open fails at that record ("says nothing about the entry"); `kairos verify`
/// (its own code, run on the same storage) must not pass the directory either.
#[test]
fn an_unreadable_entry_fails_verify_as_it_fails_the_open() -> TestResult {
    use common::bad_spots::BadSpotStorage;
    use common::{SimHarness, Stop};
    use std::sync::Arc;
    let h = SimHarness::new(7, cfg())?;
    common::far::schedule_far(h.engine(), 4)?;
    h.engine().checkpoint()?;
    let fired = common::far::fire_all(h.engine(), &h.clock, due(0))?;
    assert_eq!(fired.len(), 1);
    let mut h = h;
    h.stop(Stop::Clean)?;
    let (name, offset, _) = common::far::sim_entry_of(&h.sim, &h.dir, &key(0))?;
    let storage = BadSpotStorage::new(h.sim.process());
    storage.spots.lock().map_err(|_| "lock")?.unreadable =
        Some((format!("overflow/{name}"), offset + 30..offset + 31));
    let opened = Engine::open_with(
        &h.dir,
        h.config.clone(),
        Arc::new(storage.clone()),
        Arc::new(h.clock.clone()),
    );
    assert!(
        opened.is_err(),
        "the engine opened past an unreadable entry"
    );
    drop(opened);
    let v = kairos::fuzzing::verify_log(&storage, &h.dir.join("wal"), 1 << 20);
    assert!(!v.ok, "verify passed what the engine refuses: {}", v.json);
    Ok(())
}

/// Far tasks fired and acked after the checkpoint fill most of their file, one entry's length
/// damaged: after the reopen, checkpoints with a tiny relocation threshold (the file is a
/// compaction victim) go on, and every other far task fires once across reopens.
#[test]
fn a_damaged_finished_entry_in_a_compaction_victim() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let n = 12;
    let mut model = far_dir(&dir, n, &[])?;
    {
        let (engine, clock) = engine_at(&dir, cfg_one_attempt(), START_MS)?;
        for i in 0..8 {
            engine.reschedule(&key(i), at(START_MS + (2 + i as u64) * 60_000), None)?;
        }
        let fired = fire_on(&engine, &clock, START_MS + 12 * 60_000)?;
        assert_eq!(fired.len(), 8);
        engine.shutdown()?;
    }
    for i in 0..8 {
        model.remove(&key(i));
    }
    damage(&dir, 1, &[(key(3), Spot::Length), (key(6), Spot::Key)])?;
    assert_opens_and_tools_agree(&dir)?;
    let mut config = cfg_one_attempt();
    config.relocate_far_bytes = 1;
    for round in 0..3u64 {
        let clock = ManualClock::new(START_MS + (13 + round) * 60_000);
        let engine = open_fs(&dir, config.clone(), &clock)?;
        assert_eq!(engine.stats().pending, 4, "round {round}");
        engine.checkpoint()?;
        engine.checkpoint()?;
        engine.shutdown()?;
        run(&["verify", path(&dir)], 0);
    }
    assert_eq!(fire(&dir, START_MS + 20 * 60_000, due(n + 2))?, model);
    Ok(())
}

/// The open's error for a far task held by id that is a *dead letter* at the end of the log
/// calls it live and says `--discard` cancels it (salvage purges it); for a *missing* file it
/// says the file "is corrupt"; and it names the file and offset twice.
#[test]
fn the_open_error_says_what_happened_for_a_dead_letter_and_a_missing_file() -> TestResult {
    let tmp = tempfile::tempdir()?;
    // A dead letter.
    let dead = tmp.path().join("dead");
    far_dir(&dead, 3, &[])?;
    {
        let (engine, clock) = engine_at(&dead, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        engine.consumer().nack(&ds[0], None, "fatal")?;
        engine.shutdown()?;
    }
    damage(&dead, 1, &[(key(0), Spot::Key)])?;
    let refused = open_error(&dead);
    assert!(refused.contains("dead letter"), "{refused}");
    assert!(!refused.contains("is live"), "{refused}");
    assert!(!refused.contains("cancels it"), "{refused}");
    let file = format!("{}", overflow_file(&dead, 1).display());
    assert_eq!(refused.matches(&file).count(), 1, "{refused}");
    // A missing file, the far task in flight.
    let missing = tmp.path().join("missing");
    far_dir(&missing, 3, &[])?;
    {
        let (engine, clock) = engine_at(&missing, cfg_one_attempt(), due(0) - 30 * 60_000)?;
        let ds = next_deliveries(&engine, &clock, 40)?;
        drop(ds);
        drop(engine);
    }
    std::fs::remove_file(overflow_file(&missing, 1))?;
    let refused = open_error(&missing);
    assert!(refused.contains("missing"), "{refused}");
    assert!(!refused.contains("is corrupt"), "{refused}");
    Ok(())
}
