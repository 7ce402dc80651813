//! The MARK frame a writer puts after an fdatasync when nothing is queued (`wal/FORMAT.md`,
//! "Frame", "Writing rules": idle) is evidence of that sync, never needed by an acknowledged
//! append: a failed or short write of it — a full disk, an injected fault — poisons nothing.
//! The next frame is written where it was meant to go (over what got written of it), so a
//! crash or power cut at any point keeps every acknowledged append and reports nothing as
//! corruption.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use kairos_wal::format::{FrameKind, FRAME_HEADER_BYTES, SEGMENT_FRAMES_OFFSET};
use kairos_wal::{
    Durability, FaultKind, FaultOp, FaultPlan, LockGuard, OpenMode, SimStorage, Storage,
    StorageFile, Wal, WalOptions,
};

/// The durabilities under test; `Interval` with an interval no test reaches, so that only
/// `Wal::sync` syncs.
const MODES: [Durability; 3] = [
    Durability::Sync,
    Durability::Buffered,
    Durability::Interval(Duration::from_secs(3600)),
];

/// Bytes of room left after the last frame fits, in the full-disk cases: none (the MARK
/// writes nothing), part of a MARK's 32 bytes (it writes that much, then fails), and more
/// than its 4 zero bytes (the part written is not all zeros: a torn frame, not a zero tail).
const EXTRA_ROOM: [u64; 4] = [0, 3, 17, 31];

/// The newest segment's path and bytes.
fn newest(sim: &SimStorage) -> Result<(std::path::PathBuf, Vec<u8>), Box<dyn std::error::Error>> {
    let seg = segments(sim, dir()).pop().ok_or("no segment")?;
    let bytes = sim.read_file(&seg).ok_or("segment vanished")?;
    Ok((seg, bytes))
}

/// A log holding records 1..=4, all acknowledged, whose MARK frame after record 4's sync
/// did not fit on the disk: `extra` bytes of room were left once record 4's frame was written
/// (and, under `Sync`, what fitted of the zeros ahead of it). Returns the open log and the
/// offset the MARK was written at (the end of record 4's frame).
fn mark_on_a_full_disk(
    sim: &SimStorage,
    durability: Durability,
    extra: u64,
) -> Result<(Wal, u64), Box<dyn std::error::Error>> {
    let opts = options(durability, 1 << 20);
    let (wal, _, _) = open(sim, opts.clone())?;
    for i in 1..=3 {
        append_one(&wal, i)?;
    }
    let wal = if durability == Durability::Sync {
        // A clean close cuts the zeros a `Sync` writer keeps ahead of its frames off, so
        // that the next MARK extends the file rather than overwriting them.
        wal.close()?;
        let (wal, _, _) = open(sim, opts)?;
        let (_, bytes) = newest(sim)?;
        assert_eq!(bytes.len(), frames_end(&bytes), "no zeros ahead");
        // Room for record 4's frame and `extra` bytes: its zeros ahead take those, and the
        // MARK over them finds no more room.
        sim.set_free_bytes(Some(data_frame_bytes(body(4).len()) + extra));
        append_one(&wal, 4).map_err(|e| format!("append 4: {e}"))?;
        wal
    } else {
        wal.sync()?;
        append_one(&wal, 4)?;
        // Record 4's frame is written (not synced): the sync's MARK after it finds `extra`.
        sim.set_free_bytes(Some(extra));
        wal.sync().map_err(|e| format!("sync of 4: {e}"))?;
        wal
    };
    let (_, bytes) = newest(sim)?;
    let frames = data_frames(&bytes[..frames_end(&bytes)]);
    let (at, lsn) = *frames.last().ok_or("no data frame")?;
    assert_eq!(lsn, 4);
    let mark_at = (at as u64) + data_frame_bytes(body(4).len());
    // What got written of the MARK (all of the room there was), and nothing after it.
    assert_eq!(
        bytes.len() as u64,
        mark_at + extra,
        "{durability:?}, {extra}"
    );
    assert_eq!(sim.free_bytes(), Some(0));
    Ok((wal, mark_at))
}

/// How a test ends the writer's session before reopening.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// A process crash: every write reached the OS.
    Crash,
    /// A power cut dropping exactly what was not synced.
    CleanCut,
    /// A power cut keeping a seeded random subset of the unsynced writes, torn, zeroed or
    /// reordered.
    RandomCut,
}

fn stop(sim: &SimStorage, wal: Wal, how: Stop) {
    drop(wal);
    match how {
        Stop::Crash => sim.crash_process(),
        Stop::CleanCut => sim.power_cut_drop_unsynced(),
        Stop::RandomCut => sim.power_cut(),
    }
}

/// Where a reopen may report a torn tail (always with the LSN after the last acknowledged
/// one as its first lost LSN: it holds no acknowledged record).
#[derive(Clone, Copy, Debug)]
enum Torn {
    /// Nowhere: everything written was acknowledged and whole.
    Not,
    /// Only at this offset (a MARK cut short left there).
    At(u64),
    /// Anywhere: a random power cut may tear the MARK written after the last sync.
    Anywhere,
}

/// Reopens (under `durability`) and checks that exactly records 1..=acked survive, with no
/// error (nothing called corruption), a torn tail only where `torn` allows one, and that the
/// reopened log takes one more append and closes cleanly. Returns whether the reopen reported
/// a torn tail.
fn reopen_with_every_acked(
    sim: &SimStorage,
    durability: Durability,
    acked: u64,
    torn: Torn,
    what: &str,
) -> Result<bool, Box<dyn std::error::Error>> {
    sim.set_free_bytes(None);
    let (wal, report, replayed) = open(sim, options(durability, 1 << 20))
        .map_err(|e| format!("{what}: reopen ({durability:?}) failed: {e}"))?;
    assert_eq!(
        replayed,
        expected(acked),
        "{what} (reopened {durability:?})"
    );
    if let Some(tail) = &report.torn_tail {
        let allowed = match torn {
            Torn::Not => false,
            Torn::At(offset) => tail.offset == offset,
            Torn::Anywhere => true,
        };
        assert!(
            allowed && tail.first_lost_lsn.0 == acked + 1,
            "{what} (reopened {durability:?}): torn tail {tail:?}, expected {torn:?}"
        );
    }
    assert_eq!(append_one(&wal, acked + 1)?, acked + 1, "{what}");
    wal.close()?;
    let torn_tail = report.torn_tail.is_some();
    let (_wal, report, replayed) = open(sim, WalOptions::default())?;
    assert!(report.clean_shutdown, "{what}");
    assert_eq!(replayed, expected(acked + 1), "{what}");
    Ok(torn_tail)
}

/// What a reopen after `how` may report when everything written was acknowledged.
fn torn_after(how: Stop) -> Torn {
    match how {
        Stop::Crash | Stop::CleanCut => Torn::Not,
        Stop::RandomCut => Torn::Anywhere,
    }
}

/// A full disk when the MARK frame falls due (after an fdatasync, nothing queued) under every
/// durability: the sync is acknowledged, the log is not poisoned, and what fitted of the MARK
/// is left after the frames. Then either a crash or power cut with it still there — the
/// reopen keeps every record and calls nothing corrupt (a MARK cut short is a torn tail that
/// holds no record, or a zero tail) — or room comes back and the next appends go on, their
/// first frame written over the MARK's bytes, and a crash or power cut keeps every one.
#[test]
fn a_full_disk_when_the_mark_frame_falls_due_poisons_nothing() -> TestResult {
    for durability in MODES {
        for extra in EXTRA_ROOM {
            for how in [Stop::Crash, Stop::CleanCut, Stop::RandomCut] {
                for later_appends in [false, true] {
                    let what = format!(
                        "{durability:?}, {extra} bytes of room, {how:?}, appends after: \
                         {later_appends}"
                    );
                    let sim = SimStorage::new(700 + extra);
                    let (wal, mark_at) = mark_on_a_full_disk(&sim, durability, extra)
                        .map_err(|e| format!("{what}: {e}"))?;
                    assert_eq!(wal.poisoned(), None, "{what}: the MARK poisoned the log");
                    if !later_appends {
                        stop(&sim, wal, how);
                        let torn = reopen_with_every_acked(
                            &sim,
                            MODES[extra as usize % 3],
                            4,
                            Torn::At(mark_at),
                            &what,
                        )?;
                        if matches!(how, Stop::Crash) {
                            // The part of the MARK written is still there: past its 4 zero
                            // bytes, a torn tail (holding no record); a zero tail otherwise.
                            assert_eq!(torn, extra > 4, "{what}");
                        }
                        continue;
                    }
                    // Still full: the next append's frame does not fit (that failure is
                    // the append's own, and poisons), so room comes back first.
                    sim.set_free_bytes(None);
                    for i in 5..=12 {
                        append_one(&wal, i).map_err(|e| format!("{what}: append {i}: {e}"))?;
                    }
                    if durability != Durability::Sync {
                        wal.sync()?;
                    }
                    assert_eq!(wal.poisoned(), None, "{what}");
                    // Record 5's frame went where the MARK was.
                    let (_, bytes) = newest(&sim)?;
                    let frames = data_frames(&bytes[..frames_end(&bytes)]);
                    assert!(
                        frames.contains(&(mark_at as usize, 5)),
                        "{what}: {frames:?}, MARK at {mark_at}"
                    );
                    stop(&sim, wal, how);
                    reopen_with_every_acked(
                        &sim,
                        MODES[extra as usize % 3],
                        12,
                        torn_after(how),
                        &what,
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// A simulated disk on which the next `left` MARK frame writes fail as `kind` (an injected
/// fault, armed right before each): a short write stores a random strict prefix of the frame.
#[derive(Debug, Clone)]
struct FailingMarks {
    sim: SimStorage,
    kind: FaultKind,
    left: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

#[derive(Debug)]
struct FailingMarksFile {
    inner: Box<dyn StorageFile>,
    disk: FailingMarks,
}

impl StorageFile for FailingMarksFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        let mark = offset >= SEGMENT_FRAMES_OFFSET as u64
            && buf.len() == FRAME_HEADER_BYTES
            && buf[8] == FrameKind::Mark as u8;
        let fail = mark
            && self
                .disk
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if fail {
            self.disk.sim.inject(FaultPlan {
                after: 0,
                op: FaultOp::Write,
                kind: self.disk.kind,
            });
        }
        let r = self.inner.write_all_at(buf, offset);
        if fail {
            assert!(r.is_err(), "the injected fault did not fire");
            self.disk.failed.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}

impl Storage for FailingMarks {
    fn allows_timed_io(&self) -> bool {
        self.sim.allows_timed_io()
    }
    fn create_dir_all(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.sim.create_dir_all(p)
    }
    fn open(&self, p: &std::path::Path, m: OpenMode) -> std::io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(FailingMarksFile {
            inner: self.sim.open(p, m)?,
            disk: self.clone(),
        }))
    }
    fn list(&self, d: &std::path::Path) -> std::io::Result<Vec<String>> {
        self.sim.list(d)
    }
    fn exists(&self, p: &std::path::Path) -> std::io::Result<bool> {
        self.sim.exists(p)
    }
    fn rename(&self, f: &std::path::Path, t: &std::path::Path) -> std::io::Result<()> {
        self.sim.rename(f, t)
    }
    fn remove_file(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.sim.remove_file(p)
    }
    fn sync_dir(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.sim.sync_dir(p)
    }
    fn lock(&self, p: &std::path::Path) -> std::io::Result<Box<dyn LockGuard>> {
        self.sim.lock(p)
    }
}

/// A short write (a random strict prefix of the frame stored, then EIO), an EIO or an ENOSPC
/// on the MARK frames after the first three syncs, under every durability: nothing is
/// poisoned, every append goes on, a later MARK is written whole; then a crash or power cut
/// (random ones over many seeds: the bytes of a MARK cut short and of the frame written over
/// them may land in any order) and a reopen keep every acknowledged append, with nothing
/// called corruption.
#[test]
fn a_failed_or_short_mark_frame_write_poisons_nothing() -> TestResult {
    let mut failed = 0;
    for durability in MODES {
        for kind in [FaultKind::ShortWrite, FaultKind::Eio, FaultKind::Enospc] {
            for seed in 0..24u64 {
                let how = match seed % 4 {
                    0 => Stop::Crash,
                    1 => Stop::CleanCut,
                    _ => Stop::RandomCut,
                };
                let what = format!("{durability:?}, {kind:?}, seed {seed}, {how:?}");
                let sim = SimStorage::new(seed);
                let disk = FailingMarks {
                    sim: sim.clone(),
                    kind,
                    left: Arc::new(AtomicU64::new(0)),
                    failed: Arc::new(AtomicU64::new(0)),
                };
                let (wal, _, _) =
                    open_at(Arc::new(disk.clone()), dir(), options(durability, 1 << 20))?;
                append_one(&wal, 1)?;
                disk.left.store(3, Ordering::SeqCst);
                // Records 2..=n, synced one by one (`Sync`) or by `Wal::sync` after each
                // (the others): a MARK after each sync; the first three fail.
                let n = 8 + seed % 5;
                let mut acked = 1;
                for i in 2..=n {
                    append_one(&wal, i).map_err(|e| format!("{what}: append {i}: {e}"))?;
                    if durability != Durability::Sync {
                        wal.sync().map_err(|e| format!("{what}: sync {i}: {e}"))?;
                    }
                    acked = i;
                }
                assert_eq!(disk.failed.load(Ordering::SeqCst), 3, "{what}");
                failed += 3;
                assert_eq!(wal.poisoned(), None, "{what}");
                // A later MARK went through: the newest segment ends with one, whole.
                let (_, bytes) = newest(&sim)?;
                let end = frames_end(&bytes);
                let last =
                    kairos_wal::format::FrameHeader::parse(&bytes[end - FRAME_HEADER_BYTES..]);
                assert_eq!(last.kind, FrameKind::Mark as u8, "{what}");
                assert_eq!(last.first_lsn, acked + 1, "{what}");
                stop(&sim, wal, how);
                reopen_with_every_acked(
                    &sim,
                    MODES[seed as usize % 3],
                    acked,
                    torn_after(how),
                    &what,
                )?;
            }
        }
    }
    assert_eq!(failed, 3 * 3 * 3 * 24);
    Ok(())
}

/// A MARK frame cut short by a short write and left at the tail (the process crashed before
/// anything followed it): open cuts it off as a torn tail holding no record (or a zero tail)
/// — never corruption — under every durability, before and after.
#[test]
fn a_short_mark_frame_left_at_the_tail_reopens_as_a_torn_tail_without_records() -> TestResult {
    let mut torn_tails = 0;
    for durability in MODES {
        for seed in 0..16u64 {
            let what = format!("{durability:?}, seed {seed}");
            let sim = SimStorage::new(900 + seed);
            let disk = FailingMarks {
                sim: sim.clone(),
                kind: FaultKind::ShortWrite,
                left: Arc::new(AtomicU64::new(0)),
                failed: Arc::new(AtomicU64::new(0)),
            };
            let (wal, _, _) = open_at(Arc::new(disk.clone()), dir(), options(durability, 1 << 20))?;
            for i in 1..=5 {
                append_one(&wal, i)?;
            }
            wal.sync()?;
            // The MARK after record 6's sync: its own (`Sync`), or `Wal::sync`'s.
            disk.left.store(1, Ordering::SeqCst);
            append_one(&wal, 6)?;
            wal.sync().map_err(|e| format!("{what}: sync: {e}"))?;
            assert_eq!(disk.failed.load(Ordering::SeqCst), 1, "{what}");
            assert_eq!(wal.poisoned(), None, "{what}");
            // The frames end with record 6's (or, were the part written of the MARK whole
            // but for zero bytes over zeros ahead, with that MARK).
            let (_, bytes) = newest(&sim)?;
            let end = frames_end(&bytes) as u64;
            stop(&sim, wal, Stop::Crash);
            if reopen_with_every_acked(&sim, MODES[seed as usize % 3], 6, Torn::At(end), &what)? {
                torn_tails += 1;
            }
        }
    }
    // Most short writes stored more than the MARK's 4 leading zero bytes.
    assert!(torn_tails > 16, "{torn_tails} torn tails");
    Ok(())
}
