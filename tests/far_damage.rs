//! Damage in an overflow file holding far tasks. Far tasks are promoted by
//! reading their file in order; a damaged entry that no far task needs any
//! more (its task cancelled after the file was written) is gone past — the
//! far tasks after it fire on time, at run time and when a reopen promotes
//! them — while a far task whose own entry is damaged still poisons the
//! engine, naming the file, the offset and the task.

mod common;

use common::far::{cfg, due, fire_all, key, poisoned, schedule_far, MINUTE};
use common::{SimHarness, Stop, TaskMap, TestResult, START_MS};
use std::time::Duration;

/// Where to damage an entry.
#[derive(Clone, Copy, Debug)]
enum Spot {
    /// A byte of its key: the CRC no longer matches; its length still
    /// leads to the next entry.
    Key,
    /// A byte of its length field: nothing says where the next entry
    /// begins.
    Length,
}

/// Flips one byte of each overflow entry holding the task of a key in
/// `spots`, as it says (the entries are found before any is damaged);
/// returns each one's file name, offset and task id.
fn damage(h: &SimHarness, spots: &[(Vec<u8>, Spot)]) -> TestResult<Vec<(String, u64, u64)>> {
    let dir = h.dir.join("overflow");
    let mut found = Vec::new();
    for (key, spot) in spots {
        let (name, offset, id) = common::far::sim_entry_of(&h.sim, &h.dir, key)?;
        found.push((name, offset, id, *spot));
    }
    for (name, offset, _, spot) in &found {
        let path = dir.join(name);
        let mut bytes = h.sim.read_file(&path).ok_or("bytes")?;
        let at = match spot {
            Spot::Key => *offset as usize + 30,
            Spot::Length => *offset as usize + 1,
        };
        bytes[at] ^= 0x40;
        h.sim.write_file(&path, &bytes);
    }
    Ok(found.into_iter().map(|(n, o, id, _)| (n, o, id)).collect())
}

/// Far tasks `0..n` (due 2 h + i minutes out), made far by a checkpoint,
/// then `cancelled` cancelled (their entries stay in the file), with the
/// model of what must fire.
fn far_tasks(seed: u64, n: usize, cancelled: &[usize]) -> TestResult<(SimHarness, TaskMap)> {
    let h = SimHarness::new(seed, cfg())?;
    schedule_far(h.engine(), n)?;
    h.engine().checkpoint()?;
    assert_eq!(h.engine().stats().far, n);
    let mut model = TaskMap::new();
    for i in 0..n {
        model.insert(key(i), (due(i), format!("payload {i}").into_bytes()));
    }
    for &i in cancelled {
        assert!(h.engine().cancel(&key(i))?.is_cancelled());
        model.remove(&key(i));
    }
    Ok((h, model))
}

/// Damaged entries of cancelled far tasks — one in the middle (its key),
/// one whose length field is damaged, the file's last — do not stop the
/// promotion of the far tasks around them while the engine runs.
#[test]
fn damaged_entries_of_cancelled_far_tasks_are_gone_past_at_run_time() -> TestResult {
    let n = 20;
    let cancelled = [3, 4, 11, 19];
    let (h, model) = far_tasks(1, n, &cancelled)?;
    damage(
        &h,
        &[
            (key(3), Spot::Key),
            (key(11), Spot::Length),
            (key(19), Spot::Key),
        ],
    )?;
    let fired = fire_all(h.engine(), &h.clock, due(n + 5))?;
    assert_eq!(poisoned(h.engine()), None);
    assert_eq!(fired, model);
    let stats = h.engine().stats();
    assert_eq!((stats.far, stats.pending), (0, 0), "{stats:?}");
    // Each damaged entry gone past once, and counted.
    assert_eq!(stats.overflow_damage_skipped, 3, "{stats:?}");
    assert_eq!(h.engine().recovery().overflow_damage_skipped, 0);
    Ok(())
}

/// The same damage met by the promotion a reopen makes (tasks due within
/// the far span of the reopen, and overdue ones), after a clean shutdown and
/// after a power cut; and the reopened engine promotes the rest later.
#[test]
fn damaged_entries_of_cancelled_far_tasks_are_gone_past_at_open() -> TestResult {
    for (seed, stop, spot) in [
        (2, Stop::Clean, Spot::Key),
        (3, Stop::PowerCut, Spot::Length),
        (4, Stop::ProcessCrash, Spot::Length),
    ] {
        let n = 30;
        let cancelled = [0, 6, 7, 15, 29];
        let (mut h, model) = far_tasks(seed, n, &cancelled)?;
        h.stop(stop)?;
        let spots: Vec<_> = [0, 6, 15, 29].iter().map(|&i| (key(i), spot)).collect();
        damage(&h, &spots)?;
        // Reopened 10 minutes before task 5 is due: the far span (an hour)
        // reaches past tasks 0..=15 and beyond.
        h.clock
            .advance(Duration::from_millis(due(5) - START_MS) - 10 * MINUTE);
        h.start()?;
        assert_eq!(poisoned(h.engine()), None, "{stop:?} {spot:?}");
        let fired = fire_all(h.engine(), &h.clock, due(n + 5))?;
        assert_eq!(poisoned(h.engine()), None, "{stop:?} {spot:?}");
        assert_eq!(fired, model, "{stop:?} {spot:?}");
        // The open's promotion reads every entry (all due within its far span): the four
        // damaged ones are gone past by it, none later.
        assert_eq!(h.engine().recovery().overflow_damage_skipped, 4);
        assert_eq!(h.engine().stats().overflow_damage_skipped, 0);
        // Reopened after everything was due: nothing is left, nothing again.
        h.restart(Stop::Clean)?;
        assert_eq!(h.engine().stats().pending, 0);
    }
    Ok(())
}

/// Overdue at the reopen: the open's promotion goes past the damaged
/// entry and the catch-up delivers every other task, oldest first.
#[test]
fn overdue_far_tasks_after_a_damaged_cancelled_entry_are_caught_up() -> TestResult {
    let (mut h, model) = far_tasks(5, 10, &[2])?;
    h.stop(Stop::Clean)?;
    damage(&h, &[(key(2), Spot::Length)])?;
    h.clock.advance(Duration::from_millis(due(20) - START_MS));
    h.start()?;
    let ds = common::drain(h.engine())?;
    assert_eq!(poisoned(h.engine()), None);
    let keys: Vec<Vec<u8>> = ds.iter().map(|d| d.key().to_vec()).collect();
    let want: Vec<Vec<u8>> = model.keys().cloned().collect();
    assert_eq!(keys, want, "oldest first");
    for d in &ds {
        assert_eq!(d.payload(), &model[d.key()].1[..]);
        h.engine().consumer().ack(d)?;
    }
    Ok(())
}

/// A far task whose own entry is damaged cannot fire: the engine is
/// poisoned when the promotion reaches it — at run time and at every
/// reopen — naming the file, the entry's offset and the task.
#[test]
fn a_damaged_entry_of_a_live_far_task_poisons_naming_the_task() -> TestResult {
    for (seed, spot) in [(6, Spot::Key), (7, Spot::Length)] {
        let (mut h, _) = far_tasks(seed, 10, &[])?;
        let (name, offset, id) = damage(&h, &[(key(4), spot)])?.remove(0);
        // The promotion reads a far span (an hour) ahead: task 4's entry is
        // read once the clock is within an hour of its due time.
        h.clock
            .advance(Duration::from_millis(due(4) - START_MS) - Duration::from_secs(3600));
        h.engine().run_until_idle();
        let cause = poisoned(h.engine()).ok_or("not poisoned")?;
        for part in [
            name,
            format!("offset {offset}"),
            format!("far task {id}"),
            "kairos salvage".into(),
        ] {
            assert!(cause.contains(&part), "{spot:?}: {part} not in {cause}");
        }
        h.restart(Stop::ProcessCrash)?;
        let cause = poisoned(h.engine()).ok_or("not poisoned at reopen")?;
        assert!(cause.contains(&format!("far task {id}")), "{cause}");
    }
    Ok(())
}

/// A far task fired and acked after the checkpoint: at reopen the replay needs its entry (its
/// key) for the DELIVER that names it. An entry that cannot be *read* (EIO: a bad sector, a
/// failing disk) says nothing about the task: the open fails, naming it, and opens once the
/// read works. A *damaged* entry is held by id until the ACK finishes the task: the engine
/// opens and fires every other far task once. (Before, the damaged entry kept the directory
/// from ever opening again.)
#[test]
fn a_fired_far_tasks_entry_at_reopen_unreadable_or_damaged() -> TestResult {
    use common::bad_spots::BadSpotStorage;
    use kairos::Engine;
    use std::sync::Arc;
    let (mut h, mut model) = far_tasks(8, 6, &[])?;
    let fired = fire_all(h.engine(), &h.clock, due(0))?;
    assert_eq!(fired.keys().collect::<Vec<_>>(), [&key(0)]);
    model.remove(&key(0));
    h.stop(Stop::Clean)?;
    let (name, offset, id) = common::far::sim_entry_of(&h.sim, &h.dir, &key(0))?;
    let storage = BadSpotStorage::new(h.sim.process());
    storage.spots.lock().map_err(|_| "lock")?.unreadable =
        Some((format!("overflow/{name}"), offset..offset + 1));
    let opened = Engine::open_with(
        &h.dir,
        h.config.clone(),
        Arc::new(storage.clone()),
        Arc::new(h.clock.clone()),
    );
    let refused = opened.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        refused.contains(&format!("cannot read the overflow entry of far task {id}")),
        "{refused}"
    );
    damage(&h, &[(key(0), Spot::Key)])?;
    h.start()?;
    assert_eq!(h.engine().stats().pending, 5);
    // The promotion at open reads the file from its start: past task 0's entry, once.
    assert_eq!(h.engine().recovery().overflow_damage_skipped, 1);
    assert_eq!(fire_all(h.engine(), &h.clock, due(7))?, model);
    h.restart(Stop::Clean)?;
    assert_eq!(h.engine().stats().pending, 0);
    Ok(())
}
