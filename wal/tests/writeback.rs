//! Write-back under `Buffered` and `Interval`: every `WRITEBACK_BYTES` (4 MiB) written to the
//! active segment, a thread of the log fdatasyncs it while the writer goes on, so that the
//! writer's own syncs (roll, interval, `Wal::sync`) find little left to write. Its syncs
//! acknowledge nothing; a failed one poisons the log.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kairos_wal::{
    Durability, FaultKind, FaultOp, FaultPlan, FsStorage, Record, SimStorage, Wal, WalError,
};

/// 64 KiB records: 80 of them are 5 MiB, past one write-back.
const BODY: usize = 64 << 10;

fn append_big(wal: &Wal, i: u64) -> Result<(), WalError> {
    let body = vec![i as u8; BODY];
    wal.append(&[Record {
        record_type: 1,
        body: &body,
    }])?
    .wait()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn buffered_and_interval_logs_write_back_as_they_go() -> TestResult {
    for durability in [
        Durability::Buffered,
        Durability::Interval(Duration::from_secs(3600)),
    ] {
        let sim = SimStorage::new(1);
        sim.set_timed_io(true);
        let (wal, _, _) = open(&sim, options(durability, 64 << 20))?;
        let before = sim.sync_count();
        for i in 1..=80 {
            append_big(&wal, i)?;
        }
        // No roll, no interval, no Wal::sync: only the write-back thread syncs.
        wait_for("no write-back sync", || sim.sync_count() > before);
        drop(wal);
        // What it synced survives a power cut: at least the first 4 MiB of records.
        sim.set_timed_io(false);
        sim.power_cut();
        let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 64 << 20))?;
        assert!(
            replayed.len() >= (4 << 20) / BODY,
            "{durability:?}: {}",
            replayed.len()
        );
    }
    Ok(())
}

#[test]
fn no_write_back_under_sync_or_without_background_io() -> TestResult {
    for (timed, durability) in [(false, Durability::Buffered), (true, Durability::Sync)] {
        let sim = SimStorage::new(2);
        sim.set_timed_io(timed);
        // (No idle mark nor proof either: their syncs would be counted.)
        let options = kairos_wal::WalOptions {
            synced_mark_delay: None,
            proof_before_ack: false,
            ..options(durability, 64 << 20)
        };
        let (wal, _, _) = open(&sim, options)?;
        let before = sim.sync_count();
        for i in 1..=80 {
            append_big(&wal, i)?;
        }
        let expected = if durability == Durability::Sync {
            80
        } else {
            0
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            sim.sync_count() - before,
            expected,
            "{timed} {durability:?}"
        );
        drop(wal);
    }
    Ok(())
}

#[test]
fn a_failed_write_back_poisons_the_log_and_loses_nothing_acknowledged() -> TestResult {
    let sim = SimStorage::new(3);
    sim.set_timed_io(true);
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 64 << 20))?;
    // The first sync under Buffered without a roll is the write-back's.
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    let mut acked = 0u64;
    for i in 1..=200 {
        match append_big(&wal, i) {
            Ok(()) => acked = i,
            Err(WalError::Poisoned { .. }) | Err(WalError::Io { .. }) => break,
            Err(e) => return Err(e.into()),
        }
    }
    wait_for("the failed write-back did not poison the log", || {
        wal.poisoned().is_some()
    });
    assert!(matches!(
        append_big(&wal, 1000),
        Err(WalError::Poisoned { .. })
    ));
    drop(wal);
    // A process crash keeps everything written: every acknowledged record is there.
    sim.set_timed_io(false);
    let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 64 << 20))?;
    assert!(
        replayed.len() as u64 >= acked,
        "{} < {acked}",
        replayed.len()
    );
    Ok(())
}

#[test]
fn write_back_on_a_real_disk_across_rolls_reopens_whole() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("wal");
    let storage: Arc<dyn kairos_wal::Storage> = Arc::new(FsStorage);
    let (wal, _, _) = open_at(
        Arc::clone(&storage),
        &dir,
        options(Durability::Buffered, 6 << 20),
    )?;
    for i in 1..=300 {
        append_big(&wal, i)?;
    }
    wal.close()?;
    let (_wal, report, replayed) = open_at(storage, &dir, options(Durability::Buffered, 6 << 20))?;
    assert!(report.clean_shutdown);
    assert_eq!(replayed.len(), 300);
    assert!(replayed
        .iter()
        .enumerate()
        .all(|(k, (lsn, _, body))| *lsn == k as u64 + 1
            && body.len() == BODY
            && body[0] == (k + 1) as u8));
    Ok(())
}

/// A failed write-back (no caller waits for it) is reported to the log's owner once, from
/// the write-back thread, as it poisons the log — not only to the next caller.
#[test]
fn a_failed_write_back_is_reported_to_the_owner() -> TestResult {
    let sim = SimStorage::new(4);
    sim.set_timed_io(true);
    let (wal, _, _) = open(&sim, options(Durability::Buffered, 64 << 20))?;
    let reports = hook_into(&wal);
    // The first sync under Buffered without a roll is the write-back's.
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    for i in 1..=200 {
        if append_big(&wal, i).is_err() {
            break;
        }
    }
    wait_for("the failed write-back was not reported", || {
        !reports_of(&reports).is_empty()
    });
    let got = reports_of(&reports);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0.as_deref(), Some("kairos-wal-writeback"));
    assert!(got[0].1.contains("write-back"), "{}", got[0].1);
    assert!(wal.poisoned().is_some());
    assert_eq!(sim.faults_fired(), 1);
    Ok(())
}

/// A failed `Interval` sync (the writer thread's, with no caller waiting) is reported to the
/// owner once, from the writer thread; a hook set after the log was poisoned is told at once.
#[test]
fn a_failed_interval_sync_is_reported_to_the_owner() -> TestResult {
    let sim = SimStorage::new(5);
    let (wal, _, _) = open(
        &sim,
        options(Durability::Interval(Duration::from_millis(1)), 64 << 20),
    )?;
    let reports = hook_into(&wal);
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    // Written to the OS when this returns; the writer thread syncs it a millisecond later.
    wal.append(&[Record {
        record_type: 1,
        body: b"x",
    }])?
    .wait()?;
    wait_for("the failed interval sync was not reported", || {
        !reports_of(&reports).is_empty()
    });
    let got = reports_of(&reports);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0.as_deref(), Some("kairos-wal-writer"));
    assert!(got[0].1.contains("fdatasync"), "{}", got[0].1);
    assert_eq!(sim.faults_fired(), 1);
    // Set after the failure: told at once, on this thread.
    let late = hook_into(&wal);
    let got = reports_of(&late);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, std::thread::current().name().map(str::to_owned));
    Ok(())
}
