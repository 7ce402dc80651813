//! Model-based property test: random appends, syncs, power cuts, crashes and reopens against a
//! model (the list of acknowledged frames). Acknowledged-durable records always survive;
//! survivors are always a prefix of the appends, cut at a frame boundary.

mod common;

use std::time::Duration;

use common::*;
use kairos_wal::{Durability, Record, SimStorage, Wal, WalOptions};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// One atomic frame of these record bodies.
    Append(Vec<Vec<u8>>),
    Sync,
    PowerCut,
    PowerCutExact,
    CrashProcess,
    CloseReopen,
}

fn op() -> impl Strategy<Value = Op> {
    let bodies = prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..4);
    prop_oneof![
        12 => bodies.prop_map(Op::Append),
        2 => Just(Op::Sync),
        2 => Just(Op::PowerCut),
        1 => Just(Op::PowerCutExact),
        1 => Just(Op::CrashProcess),
        1 => Just(Op::CloseReopen),
    ]
}

fn durability() -> impl Strategy<Value = Durability> {
    prop_oneof![
        Just(Durability::Sync),
        Just(Durability::Interval(Duration::from_millis(1))),
        Just(Durability::Buffered),
    ]
}

/// What the log must hold.
#[derive(Default)]
struct Model {
    /// Acknowledged records, by LSN - 1.
    records: Vec<Vec<u8>>,
    /// Record counts at frame boundaries (0 included).
    boundaries: Vec<usize>,
    /// Records known to be durable.
    durable: usize,
}

impl Model {
    /// Checks a reopen after losing at most the non-durable suffix; adopts the survivors.
    fn reopened(&mut self, replayed: &Replayed, lossless: bool) -> Result<(), TestCaseError> {
        let n = replayed.len();
        let low = if lossless {
            self.records.len()
        } else {
            self.durable
        };
        prop_assert!(
            (low..=self.records.len()).contains(&n),
            "{} survivors, expected {}..={}",
            n,
            low,
            self.records.len()
        );
        prop_assert!(
            self.boundaries.contains(&n),
            "{} survivors cut a frame in half",
            n
        );
        for (index, (lsn, _, body)) in replayed.iter().enumerate() {
            prop_assert_eq!(*lsn, index as u64 + 1);
            prop_assert_eq!(body, &self.records[index]);
        }
        self.records.truncate(n);
        self.boundaries.retain(|b| *b <= n);
        // Open fdatasyncs the tail it replayed.
        self.durable = n;
        Ok(())
    }
}

fn reopen(sim: &SimStorage, opts: &WalOptions) -> Result<(Wal, Replayed), TestCaseError> {
    let (wal, report, replayed) =
        open(sim, opts.clone()).map_err(|e| TestCaseError::fail(format!("reopen: {e}")))?;
    if let Some(torn) = &report.torn_tail {
        prop_assert_eq!(torn.first_lost_lsn.0, replayed.len() as u64 + 1);
    }
    Ok((wal, replayed))
}

fn run(seed: u64, durability: Durability, small: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let sim = SimStorage::new(seed);
    let opts = options(durability, if small { 4096 } else { 1 << 20 });
    let mut model = Model {
        boundaries: vec![0],
        ..Model::default()
    };
    let (mut wal, _) = reopen(&sim, &opts)?;
    for op in ops {
        match op {
            Op::Append(bodies) => {
                let records: Vec<Record<'_>> = bodies
                    .iter()
                    .map(|b| Record {
                        record_type: 3,
                        body: b,
                    })
                    .collect();
                let ticket = wal
                    .append(&records)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(ticket.first_lsn().0, model.records.len() as u64 + 1);
                ticket
                    .wait()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                model.records.extend(bodies);
                model.boundaries.push(model.records.len());
                if durability == Durability::Sync {
                    model.durable = model.records.len();
                }
            }
            Op::Sync => {
                wal.sync().map_err(|e| TestCaseError::fail(e.to_string()))?;
                model.durable = model.records.len();
            }
            Op::PowerCut | Op::PowerCutExact | Op::CrashProcess => {
                match op {
                    Op::PowerCut => sim.power_cut(),
                    Op::PowerCutExact => sim.power_cut_drop_unsynced(),
                    _ => sim.crash_process(),
                }
                drop(wal);
                let (next, replayed) = reopen(&sim, &opts)?;
                model.reopened(&replayed, matches!(op, Op::CrashProcess))?;
                wal = next;
            }
            Op::CloseReopen => {
                wal.close()
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let (next, replayed) = reopen(&sim, &opts)?;
                model.reopened(&replayed, true)?;
                wal = next;
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn acked_records_survive_and_survivors_are_a_prefix(
        seed in any::<u64>(),
        durability in durability(),
        small in any::<bool>(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        run(seed, durability, small, ops)?;
    }
}
