//! Stress under `Sync`, where a lone caller commits its own round (`Writer::commit_rounds`) and
//! concurrent callers leave it to the writer thread's group commit: random mixes of appends
//! waited at once, held and waited later (in either order), dropped unwaited, barriers,
//! `Wal::sync` and segment removal, on 1–5 threads, with random segment sizes, sync latencies,
//! idle marks and proof on or off; then a power cut (random or exact) and a reopen, which must
//! hold every acknowledged record at dense LSNs. Also: close or drop while waiters wait,
//! injected faults and process crashes mid-run, and every acknowledgement proven by a durable
//! mark slot at the moment it is made. A watchdog aborts a round that hangs (60 s).
//!
//! `KAIROS_TEST_SCALE` multiplies the rounds (20 per test at 1); `KAIROS_STRESS_SEED` shifts
//! the seeds. Written by a reviewing helper against the lone-caller change.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use kairos_wal::{AppendTicket, Durability, Lsn, Record, SimStorage, WalError, WalOptions};

/// xorshift64: the rounds' choices, from their seeds.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Added to every round's seed (`KAIROS_STRESS_SEED`, default 0).
fn seed_base() -> u64 {
    std::env::var("KAIROS_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Rounds per test: 20 × `KAIROS_TEST_SCALE` (default 1).
fn scale() -> u64 {
    let scale: u64 = std::env::var("KAIROS_TEST_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    20 * scale.max(1)
}

/// Aborts the process if not disarmed within `limit` (a hang).
fn watchdog(what: String, limit: Duration) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&done);
    std::thread::spawn(move || {
        let start = Instant::now();
        while !d.load(Ordering::SeqCst) {
            if start.elapsed() > limit {
                eprintln!("HANG: {what} still running after {limit:?}");
                std::process::abort();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    done
}

fn rec_body(t: u64, k: u64, j: u64) -> Vec<u8> {
    let len = ((t * 131 + k * 17 + j * 7) % 300) as usize;
    let mut v = format!("t{t} k{k} j{j} ").into_bytes();
    v.extend((0..len).map(|i| (i as u64 * 31 + k) as u8));
    v
}

type Acked = BTreeMap<u64, Vec<u8>>;

fn mark_acked(acked: &Mutex<Acked>, first: u64, bodies: &[Vec<u8>]) {
    let mut a = acked.lock().unwrap();
    for (i, b) in bodies.iter().enumerate() {
        a.insert(first + i as u64, b.clone());
    }
}

/// A simulated disk (`seed`) with timed I/O on or off and one of `latencies_us` per fdatasync,
/// and `Sync` options with one of `segment_bytes`, a random idle-mark delay and proof on in
/// three rounds of four; also whether I/O is timed and the latency chosen.
fn random_log(
    seed: u64,
    r: &mut Rng,
    latencies_us: &[u64],
    segment_bytes: &[u64],
) -> (SimStorage, WalOptions, bool, u64) {
    let pick = |r: &mut Rng, n: usize| r.below(n as u64) as usize;
    let sim = SimStorage::new(seed);
    let timed = r.below(2) == 0;
    sim.set_timed_io(timed);
    let latency_us = latencies_us[pick(r, latencies_us.len())];
    sim.set_sync_latency(Duration::from_micros(latency_us));
    let opts = WalOptions {
        segment_bytes: segment_bytes[pick(r, segment_bytes.len())],
        durability: Durability::Sync,
        synced_mark_delay: [None, Some(Duration::ZERO), Some(Duration::from_millis(1))][pick(r, 3)],
        proof_before_ack: r.below(4) != 0,
        ..WalOptions::default()
    };
    (sim, opts, timed, latency_us)
}

/// One thread's random operations until `until`: barriers, `Wal::sync`, segment removal (with
/// `trim`: below the highest acknowledged LSN it tracks, less 5), and appends of 1–3 records
/// dropped unwaited, held (up to 3) and waited later in either order, or waited at once; each
/// acknowledged append goes into `acked`. `tolerant`: an error (an injected fault, a crash)
/// ends the thread's run; else it fails the test.
fn mixed_ops(
    wal: &kairos_wal::Wal,
    t: u64,
    seed: u64,
    until: Instant,
    acked: &Mutex<Acked>,
    trim: Option<&AtomicU64>,
    tolerant: bool,
) {
    let ok = |what: &str, result: Result<(), WalError>| match result {
        Ok(()) => true,
        Err(_) if tolerant => false,
        Err(e) => panic!("{what}: {e}"),
    };
    let mut r = Rng(seed);
    let mut k = 0u64;
    let mut held: Vec<(AppendTicket, Vec<Vec<u8>>)> = Vec::new();
    let settle = |ticket: AppendTicket, bodies: &[Vec<u8>]| {
        let (first, last) = (ticket.first_lsn().0, ticket.last_lsn().0);
        let done = ok("wait", ticket.wait());
        if done {
            mark_acked(acked, first, bodies);
            if let Some(max) = trim {
                max.fetch_max(last, Ordering::SeqCst);
            }
        }
        done
    };
    while Instant::now() < until {
        k += 1;
        let op = r.below(100);
        if op < 8 {
            if !ok("barrier", wal.barrier().wait()) {
                break;
            }
            continue;
        }
        if op < 12 {
            if !ok("sync", wal.sync()) {
                break;
            }
            continue;
        }
        if op < 14 {
            if let Some(max) = trim {
                let m = max.load(Ordering::SeqCst);
                if m > 10 {
                    let _ = wal.remove_segments_before(Lsn(m - 5));
                }
                continue;
            }
        }
        let n = 1 + r.below(3);
        let bodies: Vec<Vec<u8>> = (0..n).map(|j| rec_body(t, k, j)).collect();
        let records: Vec<Record> = bodies
            .iter()
            .map(|b| Record {
                record_type: 1,
                body: b,
            })
            .collect();
        let ticket = match wal.append(&records) {
            Ok(ticket) => ticket,
            Err(_) if tolerant => break,
            Err(e) => panic!("append: {e}"),
        };
        if op < 24 {
            drop(ticket);
            continue;
        }
        if op < 36 && held.len() < 3 {
            held.push((ticket, bodies));
            continue;
        }
        if !settle(ticket, &bodies) {
            break;
        }
        // The held ones, sometimes in reverse.
        if r.below(2) == 0 {
            held.reverse();
        }
        for (ticket, bodies) in held.drain(..) {
            settle(ticket, &bodies);
        }
    }
    for (ticket, bodies) in held.drain(..) {
        settle(ticket, &bodies);
    }
}

/// Mixed concurrent operations under Sync; then a power cut and a reopen: every
/// acknowledged record must be there.
#[test]
fn sync_mixed_ops_then_power_cut() -> TestResult {
    let rounds = scale();
    for round in 0..rounds {
        let seed = 9000 + round + seed_base();
        let mut r = Rng(seed.wrapping_mul(2654435761) | 1);
        let (sim, opts, timed, latency_us) =
            random_log(seed, &mut r, &[0, 0, 20, 200], &[4096, 8192, 1 << 20]);
        let threads = 1 + r.below(5);
        let trims = r.below(2) == 0;
        let desc = format!(
            "round {round} seed {seed} timed {timed} latency {latency_us}us threads {threads} trims {trims} {opts:?}"
        );
        let dog = watchdog(desc.clone(), Duration::from_secs(60));
        let (wal, _, _) = open(&sim, opts.clone())?;
        let acked = Mutex::new(Acked::new());
        let max_acked = AtomicU64::new(0);
        let started = Instant::now();
        let run_for = Duration::from_millis(150 + r.below(250));
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (wal, acked, max_acked) = (&wal, &acked, &max_acked);
                let tseed = seed * 1000 + t + 7;
                scope.spawn(move || {
                    let trim = trims.then_some(max_acked);
                    mixed_ops(wal, t, tseed, started + run_for, acked, trim, false);
                });
            }
        });
        assert!(wal.poisoned().is_none(), "{desc}");
        let last = wal.last_lsn().0;
        if r.below(2) == 0 {
            sim.power_cut();
        } else {
            sim.power_cut_drop_unsynced();
        }
        drop(wal);
        let (_wal, _report, replayed) = open(&sim, opts)?;
        let got: BTreeMap<u64, Vec<u8>> =
            replayed.iter().map(|(l, _, b)| (*l, b.clone())).collect();
        let first_replayed = replayed.first().map(|r| r.0).unwrap_or(u64::MAX);
        // Dense.
        for w in replayed.windows(2) {
            assert_eq!(w[0].0 + 1, w[1].0, "{desc}: LSNs not dense");
        }
        let acked = acked.into_inner().unwrap();
        for (lsn, body) in &acked {
            if *lsn < first_replayed && trims {
                continue;
            }
            assert_eq!(
                got.get(lsn),
                Some(body),
                "{desc}: acknowledged LSN {lsn} lost or changed (last appended {last}, replayed up to {:?})",
                replayed.last().map(|r| r.0)
            );
        }
        dog.store(true, Ordering::SeqCst);
    }
    Ok(())
}

/// Waiters on other threads while the log is closed (or dropped): every waiter returns,
/// after a clean close each with Ok, and everything is there after the reopen.
#[test]
fn sync_close_or_drop_while_leaders_wait() -> TestResult {
    let rounds = scale();
    for round in 0..rounds {
        let seed = 7000 + round + seed_base();
        let mut r = Rng(seed.wrapping_mul(11400714819323198485) | 1);
        let (sim, opts, _, latency_us) = random_log(seed, &mut r, &[0, 20, 200], &[4096, 1 << 20]);
        let close = r.below(2) == 0;
        let desc = format!("round {round} seed {seed} close {close} latency {latency_us} {opts:?}");
        let dog = watchdog(desc.clone(), Duration::from_secs(60));
        let (wal, _, _) = open(&sim, opts.clone())?;
        let wal = Arc::new(wal);
        let waiters = 1 + r.below(4) as usize;
        let results: Mutex<Vec<(u64, Result<(), WalError>)>> = Mutex::new(Vec::new());
        let appended = AtomicU64::new(0);
        std::thread::scope(|scope| -> TestResult {
            let mut txs = Vec::new();
            for _ in 0..waiters {
                let (tx, rx) = mpsc::channel::<AppendTicket>();
                txs.push(tx);
                let results = &results;
                scope.spawn(move || {
                    for ticket in rx {
                        let lsn = ticket.last_lsn().0;
                        let res = ticket.wait();
                        results.lock().unwrap().push((lsn, res));
                    }
                });
            }
            let appenders = 1 + r.below(3);
            let mut handles = Vec::new();
            for a in 0..appenders {
                let wal = Arc::clone(&wal);
                let txs: Vec<_> = txs.clone();
                let appended = &appended;
                let count = 20 + (seed * 7 + a) % 200;
                handles.push(scope.spawn(move || {
                    for k in 0..count {
                        let b = rec_body(a, k, 0);
                        let ticket = wal
                            .append(&[Record {
                                record_type: 1,
                                body: &b,
                            }])
                            .expect("append");
                        appended.fetch_max(ticket.last_lsn().0, Ordering::SeqCst);
                        let _ = txs[((k + a) as usize) % txs.len()].send(ticket);
                    }
                }));
            }
            drop(txs);
            for h in handles {
                h.join().expect("appender");
            }
            let wal = Arc::try_unwrap(wal).map_err(|_| "wal still shared")?;
            if close {
                wal.close()?;
            } else {
                drop(wal);
            }
            Ok(())
        })?;
        let results = results.into_inner().unwrap();
        let n = appended.load(Ordering::SeqCst);
        for (lsn, res) in &results {
            assert!(res.is_ok(), "{desc}: waiter for LSN {lsn} got {res:?}");
        }
        sim.power_cut();
        let (_wal, report, replayed) = open(&sim, opts)?;
        assert_eq!(replayed.len() as u64, n, "{desc}: {report:?}");
        dog.store(true, Ordering::SeqCst);
    }
    Ok(())
}

/// As `sync_mixed_ops_then_power_cut`, with a fault injected (a write, a sync, any op)
/// some operations in, or a process crash mid-run: no hang, every waiter returns, and
/// every acknowledged record survives a power cut.
#[test]
fn sync_faults_mid_run() -> TestResult {
    use kairos_wal::{FaultKind, FaultOp, FaultPlan};
    let rounds = scale();
    for round in 0..rounds {
        let seed = 5000 + round + seed_base();
        let mut r = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
        let (sim, opts, _, latency_us) = random_log(seed, &mut r, &[0, 20, 100], &[4096, 1 << 20]);
        let threads = 1 + r.below(4);
        let op = [
            FaultOp::Any,
            FaultOp::Write,
            FaultOp::Sync,
            FaultOp::Open,
            FaultOp::Rename,
        ][r.below(5) as usize];
        let after = r.below(300);
        let crash = r.below(5) == 0;
        let desc = format!(
            "round {round} seed {seed} threads {threads} fault {op:?} after {after} crash {crash} latency {latency_us} {opts:?}"
        );
        let dog = watchdog(desc.clone(), Duration::from_secs(60));
        let (wal, _, _) = open(&sim, opts.clone())?;
        if !crash {
            sim.inject(FaultPlan {
                after,
                op,
                kind: FaultKind::Eio,
            });
        }
        let acked = Mutex::new(Acked::new());
        let started = Instant::now();
        let run_for = Duration::from_millis(100 + r.below(200));
        let crash_at = Duration::from_millis(r.below(100));
        std::thread::scope(|scope| {
            if crash {
                let sim = &sim;
                scope.spawn(move || {
                    std::thread::sleep(crash_at);
                    sim.crash_process();
                });
            }
            for t in 0..threads {
                let (wal, acked) = (&wal, &acked);
                let tseed = seed * 1000 + t + 7;
                scope.spawn(move || {
                    mixed_ops(wal, t, tseed, started + run_for, acked, None, true);
                });
            }
        });
        let close = r.below(2) == 0;
        if close {
            let _ = wal.close();
        } else {
            drop(wal);
        }
        sim.clear_faults();
        sim.power_cut();
        let (_wal, _report, replayed) = open(&sim, opts)?;
        let got: BTreeMap<u64, Vec<u8>> =
            replayed.iter().map(|(l, _, b)| (*l, b.clone())).collect();
        for w in replayed.windows(2) {
            assert_eq!(w[0].0 + 1, w[1].0, "{desc}: LSNs not dense");
        }
        for (lsn, body) in &acked.into_inner().unwrap() {
            assert_eq!(
                got.get(lsn),
                Some(body),
                "{desc}: acknowledged LSN {lsn} lost"
            );
        }
        dog.store(true, Ordering::SeqCst);
    }
    Ok(())
}

/// Proof before acknowledgement, checked at each ack: the durable image of the (only)
/// segment holds a mark slot covering the acknowledged LSN, from several threads (so leader
/// rounds carry proofs on the next round's sync).
#[test]
fn every_sync_ack_is_proven_by_a_durable_slot() -> TestResult {
    for round in 0..scale() {
        let seed = 3000 + round + seed_base();
        let sim = SimStorage::new(seed);
        sim.set_sync_latency(Duration::from_micros([0, 30, 150][(round % 3) as usize]));
        let opts = WalOptions {
            synced_mark_delay: None,
            ..options(Durability::Sync, 1 << 24)
        };
        let (wal, _, _) = open(&sim, opts.clone())?;
        let seg = segments(&sim, dir()).pop().ok_or("no segment")?;
        let threads = 1 + round % 4;
        let bad = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (wal, sim, seg, bad) = (&wal, &sim, &seg, &bad);
                scope.spawn(move || {
                    for k in 0..60u64 {
                        let b = rec_body(t, k, 0);
                        let ticket = wal
                            .append(&[Record {
                                record_type: 1,
                                body: &b,
                            }])
                            .expect("append");
                        let lsn = ticket.last_lsn().0;
                        if k % 9 == 4 {
                            drop(ticket);
                            continue;
                        }
                        ticket.wait().expect("wait");
                        let durable = sim.read_durable_file(seg).unwrap_or_default();
                        let mark = slots_mark(&durable);
                        if mark < lsn {
                            bad.lock().unwrap().push((lsn, mark));
                        }
                    }
                });
            }
        });
        let bad = bad.into_inner().unwrap();
        assert!(
            bad.is_empty(),
            "round {round}: acked before a durable mark: {bad:?}"
        );
        drop(wal);
    }
    Ok(())
}
