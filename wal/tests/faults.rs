//! Injected I/O faults: a failed write or sync poisons the log; reopening is consistent.

mod common;

use common::*;
use kairos_wal::{
    Durability, FaultKind, FaultOp, FaultPlan, Lsn, SimStorage, Wal, WalError, WalOptions,
};

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

/// The OS error code of a failed append: its own write's or sync's.
fn io_code(error: &WalError) -> Option<i32> {
    match error {
        WalError::Io { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// [`io_code`], or under `Sync` also the code of the failure that poisoned the log before the
/// append. (Written for a fault armed right after an acknowledged append that hit the MARK
/// frame the writer puts after each sync once idle, after releasing the waiters. A failed MARK
/// poisons nothing now — `tests/mark_frame.rs` — and the lone appenders here write theirs
/// before their wait returns, so the fault reaches append 6's own write or sync; the arm stays
/// for a poison recorded by the writer thread's round.)
fn failure_code(error: &WalError, durability: Durability) -> Option<i32> {
    match error {
        WalError::Poisoned { cause } if durability == Durability::Sync => [EIO, ENOSPC]
            .into_iter()
            .find(|code| cause.ends_with(&format!("(os error {code})"))),
        _ => io_code(error),
    }
}

/// After a failed append: the log refuses everything, and close reports the poison.
fn assert_poisoned(wal: Wal) {
    assert!(wal.poisoned().is_some());
    assert!(matches!(
        append_one(&wal, 999),
        Err(WalError::Poisoned { .. })
    ));
    assert!(matches!(wal.sync(), Err(WalError::Poisoned { .. })));
    assert!(matches!(wal.close(), Err(WalError::Poisoned { .. })));
}

/// Appends 1..=5 (acked), arms `plan`, appends 6 and expects its wait to fail with `code`;
/// then checks poisoning and that a reopen holds 1..=5 plus possibly 6, and continues.
fn fault_case(seed: u64, durability: Durability, plan: FaultPlan, code: i32) -> TestResult {
    let sim = SimStorage::new(seed);
    let opts = options(durability, 1 << 20);
    let (wal, _, _) = open(&sim, opts.clone())?;
    for i in 1..=5 {
        append_one(&wal, i)?;
    }
    sim.inject(plan);
    let error = append_one(&wal, 6)
        .err()
        .ok_or("append 6 should have failed")?;
    assert_eq!(failure_code(&error, durability), Some(code), "{error}");
    assert_poisoned(wal);

    let (wal, report, replayed) = open(&sim, opts.clone())?;
    let survivors = assert_prefix(&replayed, 5, 6);
    assert_eq!(append_one(&wal, survivors + 1)?, survivors + 1);
    wal.close()?;
    let (_wal, report2, replayed) = open(&sim, opts)?;
    assert_prefix(&replayed, survivors + 1, survivors + 1);
    assert!(report2.clean_shutdown);
    let _ = report;
    Ok(())
}

#[test]
fn eio_on_sync_fails_the_waiters_and_poisons_the_log() -> TestResult {
    let plan = FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    };
    fault_case(40, Durability::Sync, plan, EIO)
}

#[test]
fn enospc_on_write_fails_the_waiters_and_poisons_the_log() -> TestResult {
    let plan = FaultPlan {
        after: 0,
        op: FaultOp::Write,
        kind: FaultKind::Enospc,
    };
    fault_case(41, Durability::Sync, plan, ENOSPC)?;
    fault_case(42, Durability::Buffered, plan, ENOSPC)
}

#[test]
fn short_write_fails_the_waiters_and_leaves_a_torn_tail() -> TestResult {
    for seed in 43..53 {
        let plan = FaultPlan {
            after: 0,
            op: FaultOp::Write,
            kind: FaultKind::ShortWrite,
        };
        fault_case(seed, Durability::Sync, plan, EIO)?;
        fault_case(
            seed,
            Durability::Interval(std::time::Duration::from_secs(60)),
            plan,
            EIO,
        )?;
    }
    Ok(())
}

#[test]
fn eio_on_sync_with_concurrent_waiters_fails_all_of_them() -> TestResult {
    let sim = SimStorage::new(54);
    sim.set_sync_latency(std::time::Duration::from_millis(2));
    let (wal, _, _) = open(&sim, WalOptions::default())?;
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    let results: Vec<Result<(), WalError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..6)
            .map(|t| {
                let wal = &wal;
                scope.spawn(move || -> Result<(), WalError> {
                    wal.append(&[kairos_wal::Record {
                        record_type: 1,
                        body: &[t],
                    }])?
                    .wait()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(WalError::Closed)))
            .collect()
    });
    // No append was acknowledged: the first sync failed and nothing is retried.
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(wal.poisoned().is_some());
    assert_eq!(wal.synced_lsn(), Lsn(0));
    Ok(())
}

/// The I/O error countdown (SQLite, redb, sled): fail operation number `n` of a workload that
/// opens, appends, rolls segments and closes; whatever happens, a reopen without faults must
/// succeed with a prefix of the appends that includes every acknowledged one.
#[test]
fn every_failing_operation_leaves_a_reopenable_log() -> TestResult {
    let workload = |sim: &SimStorage| -> (u64, u64) {
        // Returns (acked, attempted).
        let Ok((wal, _, _)) = open(sim, options(Durability::Sync, 4096)) else {
            return (0, 0);
        };
        let mut acked = 0;
        let mut attempted = 0;
        for i in 1..=60 {
            attempted = i;
            if append_one(&wal, i).is_err() {
                break;
            }
            acked = i;
        }
        let _ = wal.close();
        (acked, attempted)
    };
    let total = {
        let sim = SimStorage::new(60);
        let (acked, _) = workload(&sim);
        assert_eq!(acked, 60);
        sim.io_ops()
    };
    for kind in [FaultKind::Eio, FaultKind::Enospc, FaultKind::ShortWrite] {
        for n in 0..total {
            let sim = SimStorage::new(60);
            sim.inject(FaultPlan {
                after: n,
                op: FaultOp::Any,
                kind,
            });
            let (acked, attempted) = workload(&sim);
            sim.clear_faults();
            let (wal, _, replayed) = open(&sim, options(Durability::Sync, 4096))
                .map_err(|e| format!("{kind:?} at op {n}: reopen failed: {e}"))?;
            assert_prefix(&replayed, acked, attempted);
            drop(wal);
            // And after a power cut too.
            sim.power_cut();
            let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 4096))
                .map_err(|e| format!("{kind:?} at op {n}: reopen after cut failed: {e}"))?;
            assert_prefix(&replayed, acked, attempted);
        }
    }
    Ok(())
}

#[test]
fn power_cut_during_bootstrap_never_wedges_the_directory() -> TestResult {
    // Cut the power after each operation of the very first open (etcd #16596).
    let total = {
        let sim = SimStorage::new(61);
        let (wal, _, _) = open(&sim, WalOptions::default())?;
        drop(wal);
        sim.io_ops()
    };
    for n in 0..total {
        let sim = SimStorage::new(61);
        sim.inject(FaultPlan {
            after: n,
            op: FaultOp::Any,
            kind: FaultKind::Eio,
        });
        let _ = open(&sim, WalOptions::default()).map(|(wal, _, _)| drop(wal));
        sim.power_cut(); // also disarms the fault if it did not fire
        let (wal, report, _) = open(&sim, WalOptions::default())
            .map_err(|e| format!("after a fault at op {n}: {e}"))?;
        assert_eq!(report.last_lsn, Lsn(0));
        assert_eq!(append_one(&wal, 1)?, 1);
    }
    Ok(())
}

/// Found by the deterministic simulation (seeds 235, 304): a roll whose directory fsync failed
/// poisons the log, but the new segment's rename sits in the page cache. After a process
/// crash, recovery adopted that segment and acknowledged new records in it; a power cut then
/// undid the rename and took them with it (and their LSNs were reused). Open now fsyncs the
/// directory before accepting appends. Checked for a sync fault at every point of the roll.
#[test]
fn records_acknowledged_after_a_failed_roll_survive_a_power_cut() -> TestResult {
    for after in 0..40 {
        let sim = SimStorage::new(40 + after);
        let opts = options(Durability::Sync, kairos_wal::SEGMENT_BYTES_MIN);
        let (wal, _, _) = open(&sim, opts.clone())?;
        let mut acked = 0;
        // Up to the first roll, then fail the `after`-th sync from there on.
        while segments(&sim, dir()).len() < 2 && acked < 10_000 {
            acked = append_one(&wal, acked + 1)?;
            if segments(&sim, dir()).len() < 2 && near_roll(&sim) {
                break;
            }
        }
        sim.inject(FaultPlan {
            after,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        let mut failed = false;
        for _ in 0..200 {
            match append_one(&wal, acked + 1) {
                Ok(lsn) => acked = lsn,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "after {after}: the injected sync fault never fired");
        drop(wal);
        sim.clear_faults();
        sim.crash_process();
        let (wal, report, _) = open(&sim, opts.clone())?;
        let base = report.last_lsn.0;
        assert!(
            base >= acked,
            "after {after}: acknowledged {acked}, recovered {base}"
        );
        for i in base + 1..=base + 5 {
            assert_eq!(append_one(&wal, i)?, i);
        }
        drop(wal);
        sim.power_cut_drop_unsynced();
        let (_wal, report, replayed) = open(&sim, opts)?;
        assert!(
            report.last_lsn.0 >= base + 5,
            "after {after}: 5 records acknowledged after the reopen were lost: {report:?}"
        );
        assert_eq!(
            replayed.iter().map(|r| r.0).collect::<Vec<_>>(),
            (1..=report.last_lsn.0).collect::<Vec<_>>()
        );
    }
    Ok(())
}

/// Whether the active (first) segment is within a few frames of the roll size.
fn near_roll(sim: &SimStorage) -> bool {
    let len = segments(sim, dir())
        .first()
        .and_then(|first| sim.read_file(first))
        .map_or(0, |b| b.len() as u64);
    len + 200 >= kairos_wal::SEGMENT_BYTES_MIN
}
