//! Crashes and power cuts at every step of a `Sync` writer that keeps zeros written ahead of its
//! frames (`wal/FORMAT.md`, "Writing rules", preallocation): between an extending write and its
//! fdatasync, between a roll's `set_len` and the SEAL's fdatasync, during a clean close. Every
//! such directory opens (under any durability), keeps every acknowledged append, and replays
//! exactly a prefix of what was appended. The same after zeros that came out short (a short or
//! failed write of them, a full disk), which fail no append.

mod common;

use common::*;
use kairos_wal::format::{FrameKind, FRAME_HEADER_BYTES, RECORD_HEADER_BYTES};
use kairos_wal::{
    Durability, FaultKind, FaultOp, FaultPlan, Record, SimStorage, Wal, WalError, WalOptions,
};

/// Segment size of the sweeps: several 64 KiB zero runs fit, and the workload rolls twice.
const SEGMENT: u64 = 160 * 1024;

/// Body of record `i` in the sweeps: a few KiB, so a write stays under the 16 KiB that
/// preallocates and a segment fills in a few dozen appends.
fn big_body(i: u64) -> Vec<u8> {
    let len = 2000 + (i * 977 % 3000) as usize;
    (0..len).map(|k| (i as usize * 13 + k) as u8).collect()
}

fn append_big(wal: &Wal, i: u64) -> Result<u64, WalError> {
    append_body(wal, i, &big_body(i))
}

fn check_prefix(replayed: &Replayed, acked: u64, attempted: u64, what: &str) {
    let n = replayed.len() as u64;
    assert!(
        (acked..=attempted).contains(&n),
        "{what}: {n} records survived, expected {acked}..={attempted}"
    );
    for (k, (lsn, ty, b)) in replayed.iter().enumerate() {
        let i = k as u64 + 1;
        assert_eq!(
            (*lsn, *ty, b),
            (i, record_type(i), &big_body(i)),
            "{what}: record {i} is not what was appended"
        );
    }
}

/// Appends until `n` records or the first failure, then closes; returns (acked, attempted).
fn workload(sim: &SimStorage, n: u64) -> (u64, u64) {
    let Ok((wal, _, _)) = open(sim, options(Durability::Sync, SEGMENT)) else {
        return (0, 0);
    };
    let mut acked = 0;
    let mut attempted = 0;
    for i in 1..=n {
        attempted = i;
        if append_big(&wal, i).is_err() {
            break;
        }
        acked = i;
    }
    let _ = wal.close();
    (acked, attempted)
}

fn reopen_opts(k: u64) -> WalOptions {
    let durability = match k % 3 {
        0 => Durability::Sync,
        1 => Durability::Buffered,
        _ => Durability::Interval(std::time::Duration::from_millis(1)),
    };
    options(durability, SEGMENT)
}

/// Reopens (twice: after the cut, then after appending one more and closing) and checks.
fn reopen_and_check(
    sim: &SimStorage,
    acked: u64,
    attempted: u64,
    k: u64,
    what: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let scanned = if segments(sim, dir()).is_empty() {
        None
    } else {
        Some(
            kairos_wal::scan(sim, dir(), 1 << 20, &mut |_| {})
                .map_err(|e| format!("{what}: scan failed: {e}"))?,
        )
    };
    let (wal, report, replayed) =
        open(sim, reopen_opts(k)).map_err(|e| format!("{what}: open failed: {e}"))?;
    if let Some(scanned) = scanned {
        assert_eq!(scanned.last_lsn, report.last_lsn, "{what}");
        assert_eq!(scanned.torn_tail, report.torn_tail, "{what}");
    }
    check_prefix(&replayed, acked, attempted, what);
    let n = replayed.len() as u64;
    // The zeros are gone from every segment but possibly the newest, which open cut too.
    for seg in segments(sim, dir()) {
        let bytes = sim.read_file(&seg).ok_or("segment vanished")?;
        assert_eq!(
            bytes.len(),
            frames_end(&bytes),
            "{what}: {seg:?} after open"
        );
    }
    let lsn = append_big(&wal, n + 1).map_err(|e| format!("{what}: append after open: {e}"))?;
    assert_eq!(lsn, n + 1, "{what}");
    wal.close()?;
    let (_wal, report, replayed) =
        open(sim, reopen_opts(k + 1)).map_err(|e| format!("{what}: second open failed: {e}"))?;
    assert!(report.clean_shutdown, "{what}");
    check_prefix(&replayed, n + 1, n + 1, what);
    Ok(())
}

/// The number of storage operations the fault-free workload makes.
fn total_ops(n: u64) -> u64 {
    let sim = SimStorage::new(1);
    let (acked, _) = workload(&sim, n);
    assert_eq!(acked, n);
    assert!(segments(&sim, dir()).len() >= 3, "the workload rolls twice");
    sim.io_ops()
}

/// An I/O error at every operation (the writer stops there, poisoned, as if the process died
/// right before it), then a process crash, a clean power cut or a random one (tearing,
/// zeroing, reordering unsynced writes and length changes).
#[test]
fn a_fault_at_every_step_then_a_crash_or_power_cut_reopens_with_every_acked_append() -> TestResult {
    let n = 120;
    let total = total_ops(n);
    let (mut zero_tails, mut sealed_zero_tails) = (0, 0);
    for op in 0..total + 1 {
        for (how, seed) in [(0u64, op), (1, op), (2, op), (2, op + 100_000)] {
            let sim = SimStorage::new(seed);
            sim.inject(FaultPlan {
                after: op,
                op: FaultOp::Any,
                kind: FaultKind::Eio,
            });
            let (acked, attempted) = workload(&sim, n);
            sim.clear_faults();
            match how {
                0 => sim.crash_process(),
                1 => sim.power_cut_drop_unsynced(),
                _ => sim.power_cut(),
            }
            let what = format!("fault at op {op}, {how}, seed {seed}");
            if let Some(seg) = segments(&sim, dir()).pop() {
                let bytes = sim.read_file(&seg).unwrap_or_default();
                let end = frames_end(&bytes);
                if bytes.len() > end {
                    zero_tails += 1;
                    if end >= 128 + 32 && bytes[end - 24] == FrameKind::Seal as u8 {
                        sealed_zero_tails += 1;
                    }
                }
            }
            reopen_and_check(&sim, acked, attempted, op + how, &what)?;
        }
    }
    // The sweep did stop writers with zeros ahead, and between a SEAL and its `set_len`.
    assert!(
        zero_tails > 1000,
        "{zero_tails} zero tails over {total} ops"
    );
    assert!(
        sealed_zero_tails > 0,
        "no SEAL followed by zeros over {total} ops"
    );
    Ok(())
}

/// The same with the failing operation a sync only: the writes before it stay in the page cache
/// (and may or may not reach the disk), as when the power goes while an fdatasync runs.
#[test]
fn a_failed_sync_at_every_step_then_a_power_cut_reopens_with_every_acked_append() -> TestResult {
    let n = 120;
    for after in 0..200 {
        for seed in [after, after + 7_000, after + 9_000] {
            let sim = SimStorage::new(seed);
            sim.inject(FaultPlan {
                after,
                op: FaultOp::Sync,
                kind: FaultKind::Eio,
            });
            let (acked, attempted) = workload(&sim, n);
            sim.clear_faults();
            sim.power_cut();
            let what = format!("sync fault {after}, seed {seed}");
            reopen_and_check(&sim, acked, attempted, after, &what)?;
        }
    }
    Ok(())
}

/// A fixed-size body of record `lsn` written in session `session` (so that the frames of two
/// sessions line up, and a record of one session is told from the other's).
fn session_body(session: u8, lsn: u64) -> Vec<u8> {
    // Frames of one 512-byte sector each from LSN 11 on (after the first, the nine after it
    // and the MARK frame a sync leaves).
    let frame = if lsn == 1 { 352 } else { 512 };
    let mut b = vec![session; frame - FRAME_HEADER_BYTES - RECORD_HEADER_BYTES];
    b[..8].copy_from_slice(&lsn.to_le_bytes());
    b
}

fn append_session(wal: &Wal, session: u8, lsn: u64) -> Result<u64, WalError> {
    let b = session_body(session, lsn);
    let ticket = wal.append(&[Record {
        record_type: 1,
        body: &b,
    }])?;
    let got = ticket.last_lsn().0;
    assert_eq!(got, lsn);
    ticket.wait()?;
    Ok(got)
}

/// Stale bytes (FORMAT.md: unsynced bytes may read back stale after a power cut) in the zeros
/// an extending `Sync` write puts ahead of its frames must not read back as records of an
/// earlier history: a torn tail that open cut off holds valid frames further on; the next
/// session's first append (not acknowledged: its sync fails) writes its frame where the torn
/// one was, and zeros over those old frames; a power cut shows the old bytes where the zeros
/// did not land. Recovery must replay only records this history appended.
#[test]
fn stale_bytes_under_the_zeros_ahead_never_replay_as_records_of_this_history() -> TestResult {
    let mut invented = Vec::new();
    let mut cases = 0;
    for seed in 0..3000u64 {
        let sim = SimStorage::new(20_000 + seed);
        sim.set_stale_history(true);
        // Session 1 (Buffered): 1..=10 synced, 11..=40 written only.
        let (wal, _, _) = open(&sim, options(Durability::Buffered, 1 << 20))?;
        for lsn in 1..=10 {
            append_session(&wal, 1, lsn)?;
        }
        wal.sync()?;
        for lsn in 11..=40 {
            append_session(&wal, 1, lsn)?;
        }
        drop(wal);
        sim.power_cut();
        let (wal, report, replayed) = open(&sim, options(Durability::Sync, 1 << 20))?;
        assert!(replayed.len() >= 10);
        if report.torn_tail.is_none() {
            continue;
        }
        cases += 1;
        let first = report.last_lsn.0 + 1;
        // Session 2 (Sync): one append whose fdatasync fails, then the power goes.
        sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        assert!(append_session(&wal, 2, first).is_err());
        drop(wal);
        sim.clear_faults();
        sim.power_cut();
        let (_wal, _, replayed) = open(&sim, options(Durability::Sync, 1 << 20))?;
        for (lsn, _, b) in &replayed {
            let session = if *lsn < first { 1 } else { 2 };
            if *lsn > first || *b != session_body(session, *lsn) {
                invented.push((seed, *lsn, b[8]));
                break;
            }
        }
    }
    assert!(cases > 1000, "only {cases} torn tails");
    assert!(
        invented.is_empty(),
        "records of a cut-off history replayed (seed, lsn, session): {invented:?}"
    );
    Ok(())
}

/// Zeros from a durable record to the end of the file read as a zero tail only where nothing
/// says the record was durable; wherever something does (`CLOSED` after a clean close, a mark
/// slot, a SEAL and a newer segment), they are `Corrupt` as any other damage there.
#[test]
fn zeros_to_the_end_over_durable_records_stay_corrupt() -> TestResult {
    // (a) After a clean close: CLOSED names the last LSN; zeros over the last records and the
    // CLOSE frame (a file cut back to zeros from a record on).
    // (b) A crash after acknowledged appends: zeros from the newest segment's first record.
    // (c) Zeros from a record of a sealed segment to its end, a newer segment after it.
    for case in ['a', 'b', 'c'] {
        let sim = SimStorage::new(90);
        let (wal, _, _) = open(&sim, options(Durability::Sync, SEGMENT))?;
        for i in 1..=60 {
            append_big(&wal, i)?;
        }
        let segs = segments(&sim, dir());
        assert!(segs.len() >= 2, "the appends rolled");
        let seg = match case {
            'a' => {
                wal.close()?;
                segs[segs.len() - 1].clone()
            }
            'b' => {
                drop(wal);
                sim.crash_process();
                segs[segs.len() - 1].clone()
            }
            _ => {
                drop(wal);
                sim.crash_process();
                segs[0].clone()
            }
        };
        let mut bytes = sim.read_file(&seg).ok_or("segment vanished")?;
        let frames = data_frames(&bytes[..frames_end(&bytes)]);
        let at = match case {
            'b' => frames[0].0,
            _ => frames[frames.len() - 2].0,
        };
        bytes[at..].fill(0);
        sim.write_file(&seg, &bytes);
        let before = snapshot(&sim, dir());
        for durability in [Durability::Sync, Durability::Buffered] {
            match open(&sim, options(durability, SEGMENT)) {
                Err(WalError::Corrupt { file, offset, .. }) => {
                    assert_eq!((file, offset), (seg.clone(), at as u64), "case {case}");
                }
                other => return Err(format!("case {case}: expected Corrupt, got {other:?}").into()),
            }
            assert!(
                kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {}).is_err(),
                "case {case}: scan"
            );
            assert_eq!(
                snapshot(&sim, dir()),
                before,
                "case {case}: a refused open changes nothing"
            );
        }
    }
    Ok(())
}

/// How the zeros a `Sync` writer puts ahead of its first frame come out short.
#[derive(Clone, Copy, Debug)]
enum ShortZeros {
    /// The zeros write stores a random strict prefix of them, then fails (EIO).
    ShortWrite,
    /// The zeros write fails (EIO) and stores nothing.
    Eio,
    /// A full disk: room for the first frame and a random part of the zeros; the appends
    /// after it go on until one does not fit (ENOSPC, poisoned).
    FullDisk,
}

/// A `Sync` log whose first append's zeros ahead come out short (`how`), then appends until
/// `n` or the first failure: into what was written of the zeros, past it (extending the file
/// with no zeros ahead), then with zeros ahead again. The log is left open; returns it with
/// (acked, attempted).
fn short_zeros_workload(
    sim: &SimStorage,
    how: ShortZeros,
    seed: u64,
    n: u64,
) -> Result<(Wal, u64, u64), Box<dyn std::error::Error>> {
    let (wal, _, _) = open(sim, options(Durability::Sync, SEGMENT))?;
    match how {
        ShortZeros::ShortWrite | ShortZeros::Eio => {
            // The first append's write of its frame is write 0; the zeros after it write 1.
            sim.inject(FaultPlan {
                after: 1,
                op: FaultOp::Write,
                kind: match how {
                    ShortZeros::ShortWrite => FaultKind::ShortWrite,
                    _ => FaultKind::Eio,
                },
            });
        }
        ShortZeros::FullDisk => {
            let frame = data_frame_bytes(big_body(1).len());
            sim.set_free_bytes(Some(frame + seed * 7919 % 60_000));
        }
    }
    let (mut acked, mut attempted) = (0, 0);
    for i in 1..=n {
        attempted = i;
        if append_big(&wal, i).is_err() {
            break;
        }
        acked = i;
        if i == 1 {
            // The zeros did come out short: the file ends before the 64 KiB past the frame.
            let seg = segments(sim, dir()).pop().ok_or("no segment")?;
            let bytes = sim.read_file(&seg).ok_or("segment vanished")?;
            let frame_end = data_frames(&bytes)[0].0 + data_frame_bytes(big_body(1).len()) as usize;
            assert!(
                bytes.len() < frame_end + 64 * 1024,
                "{how:?}: {}",
                bytes.len()
            );
        }
    }
    sim.clear_faults();
    Ok((wal, acked, attempted))
}

/// Zeros ahead of the frames cut short — a short write, a failed write, a full disk — are
/// not fatal; then a process crash, a clean power cut or a random one, and a reopen in every
/// durability mode: every acknowledged append is there, nothing is called corrupt, and the
/// log goes on (`reopen_and_check`).
#[test]
fn zeros_ahead_cut_short_then_a_crash_or_power_cut_keep_every_acked_append() -> TestResult {
    let mut full_disk_failures = 0;
    for seed in 0..24u64 {
        for how in [
            ShortZeros::ShortWrite,
            ShortZeros::Eio,
            ShortZeros::FullDisk,
        ] {
            for cut in 0..3u64 {
                for k in 0..3u64 {
                    let sim = SimStorage::new(seed * 31 + cut);
                    let n = 3 + seed % 20;
                    let (wal, acked, attempted) = short_zeros_workload(&sim, how, seed, n)?;
                    let what = format!("{how:?}, seed {seed}, cut {cut}, reopen mode {k}");
                    match how {
                        ShortZeros::FullDisk => {
                            if acked < n {
                                full_disk_failures += 1;
                            }
                            assert!(acked >= 1, "{what}: the first frame fits");
                        }
                        _ => {
                            assert_eq!(acked, n, "{what}: a failed zeros write is not fatal");
                            assert_eq!(wal.poisoned(), None, "{what}");
                        }
                    }
                    match cut {
                        0 => sim.crash_process(),
                        1 => sim.power_cut_drop_unsynced(),
                        _ => sim.power_cut(),
                    }
                    drop(wal);
                    sim.set_free_bytes(None);
                    if cut < 2 && acked == attempted {
                        // Everything written was acknowledged: nothing to call torn.
                        let (_wal, report, _) = open(&sim, reopen_opts(k))?;
                        assert_eq!(report.torn_tail, None, "{what}");
                        drop(_wal);
                    }
                    reopen_and_check(&sim, acked, attempted, k, &what)?;
                }
            }
        }
    }
    assert!(full_disk_failures > 0, "no full disk refused a frame");
    Ok(())
}
