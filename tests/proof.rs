//! Proof before acknowledgement at the engine's level (`Config::proof_before_ack`, the
//! default; `wal/FORMAT.md`, "Proof before acknowledgement"): once `schedule` or `cancel`
//! returned under `Sync`, no damage to the log's tail after a crash — the last group commit's
//! frames included — can drop it silently: the restart either has it or refuses the directory
//! as corrupt, naming file and offset, and leaves every byte as it was. The same tail cuts
//! without proof read as a torn write (`tests/torn_tail.rs`, the documented opt-out).

mod common;

use common::{config, frames, key, payload, SimHarness, Stop, TestResult, FRAME_KIND_DATA};
use kairos::{CancelOutcome, Durability, OpenError};
use kairos_wal::WalError;
use std::time::Duration;

/// Tasks each case schedules (one record each); every second one is then cancelled.
const TASKS: usize = 12;

#[test]
fn an_acknowledged_schedule_or_cancel_is_never_cut_off_silently() -> TestResult {
    // Cut each of the last DATA frames (the last cancel's, the last schedule's, ...) at its
    // start and inside it, after a process crash and after a power cut.
    for (case, stop) in [Stop::ProcessCrash, Stop::PowerCut].into_iter().enumerate() {
        let mut h = SimHarness::new(40 + case as u64, config(Durability::Sync))?;
        for i in 0..TASKS {
            h.engine().schedule_after(
                &key("p", i),
                Duration::from_secs(60),
                &payload("p", i, 80),
            )?;
        }
        for i in (0..TASKS).step_by(2) {
            assert_eq!(
                h.engine().cancel(&key("p", i))?,
                CancelOutcome::Cancelled { deliveries: 0 }
            );
        }
        h.stop(stop)?;
        let segment = h.segments()?.pop().ok_or("no segment")?;
        let image = h.sim.read_file(&segment).ok_or("segment vanished")?;
        let data: Vec<_> = frames(&image)
            .into_iter()
            .filter(|f| f.kind == FRAME_KIND_DATA)
            .collect();
        assert!(
            data.len() >= TASKS + TASKS / 2,
            "{stop:?}: {} frames",
            data.len()
        );
        for frame in data.iter().rev().take(4) {
            for cut in [frame.offset, frame.offset + 9] {
                h.sim.write_file(&segment, &image[..cut as usize]);
                match h.open() {
                    Err(OpenError::Wal(WalError::Corrupt { file, offset, .. })) => {
                        assert_eq!(file, segment, "{stop:?} cut {cut}");
                        assert_eq!(offset, frame.offset, "{stop:?} cut {cut}");
                    }
                    Err(other) => panic!("{stop:?} cut {cut}: {other:?}"),
                    Ok(engine) => panic!(
                        "{stop:?}: cut at {cut} opened, dropping an acknowledged call: {:?}",
                        engine.recovery()
                    ),
                }
                assert_eq!(
                    h.sim.read_file(&segment).as_deref(),
                    Some(&image[..cut as usize]),
                    "a refused open changed the segment"
                );
            }
        }
        // Undamaged, every task that was not cancelled fires, and no cancelled one does.
        h.sim.write_file(&segment, &image);
        h.start()?;
        assert_eq!(h.engine().recovery().pending, TASKS / 2, "{stop:?}");
        let fired = h.advance(Duration::from_secs(120))?;
        let mut keys: Vec<Vec<u8>> = fired.iter().map(|d| d.key().to_vec()).collect();
        keys.sort();
        let mut want: Vec<Vec<u8>> = (1..TASKS).step_by(2).map(|i| key("p", i)).collect();
        want.sort();
        assert_eq!(keys, want, "{stop:?}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

#[test]
fn without_proof_the_last_group_commit_cut_off_reads_as_a_torn_tail() -> TestResult {
    // The opt-out's documented limit, pinned: the same cut of the last schedule's frame opens,
    // reporting a torn tail, with that task gone.
    let mut config = config(Durability::Sync);
    config.proof_before_ack = false;
    config.synced_mark_delay = None;
    let mut h = SimHarness::new(50, config)?;
    for i in 0..TASKS {
        h.engine()
            .schedule_after(&key("u", i), Duration::from_secs(60), &payload("u", i, 80))?;
    }
    h.stop(Stop::PowerCut)?;
    let segment = h.segments()?.pop().ok_or("no segment")?;
    let image = h.sim.read_file(&segment).ok_or("segment vanished")?;
    let last = frames(&image)
        .into_iter()
        .rfind(|f| f.kind == FRAME_KIND_DATA)
        .ok_or("no frame")?;
    h.sim
        .write_file(&segment, &image[..last.offset as usize + 9]);
    h.start()?;
    let torn = h
        .engine()
        .recovery()
        .wal
        .torn_tail
        .clone()
        .ok_or("no torn tail")?;
    assert_eq!(torn.offset, last.offset);
    assert_eq!(h.engine().recovery().pending, TASKS - 1);
    h.stop(Stop::Clean)?;
    Ok(())
}
