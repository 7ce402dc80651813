//! The mark slots of a version-2 segment (`wal/FORMAT.md`, "Mark slots"): each sync makes
//! durable a slot recording the sync before it, so after an unclean shutdown under a steady
//! load — no idle pause, so no `SYNCED` — outside damage that cuts synced frames off the
//! newest segment is still refused, except within the frames of the last sync (the documented
//! limit, pinned here). A torn slot write is survived, and version-1 segments (no slots) are
//! still read and appended to.

mod common;

use common::*;
use kairos_wal::format::{
    self, encode_meta, MarkSlot, SegmentHeader, MARK_SLOTS_OFFSET, MARK_SLOT_BYTES,
    SEGMENT_FRAMES_OFFSET,
};
use kairos_wal::{Durability, FaultKind, FaultOp, FaultPlan, SimStorage, WalError, WalOptions};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Sync, 1 MiB segments, no idle high-water mark and no proof before acknowledgement (its
/// second sync would write a slot of its own: `wal/tests/proof.rs`): only the slots, one sync
/// behind, can tell.
fn steady() -> WalOptions {
    WalOptions {
        synced_mark_delay: None,
        proof_before_ack: false,
        ..options(Durability::Sync, 1 << 20)
    }
}

fn mark(synced_lsn: u64, seq: u64) -> MarkSlot {
    MarkSlot::Mark { synced_lsn, seq }
}

#[test]
fn each_sync_records_the_sync_before_it_alternating_slots() -> TestResult {
    let sim = SimStorage::new(1);
    let (wal, _, _) = open(&sim, steady())?;
    let seg = segments(&sim, dir())[0].clone();
    let slots = || slots_of(&sim.read_file(&seg).unwrap_or_default());
    assert_eq!(slots(), [MarkSlot::Empty, MarkSlot::Empty]);
    append_one(&wal, 1)?;
    // Nothing was synced before the first sync: no slot written.
    assert_eq!(slots(), [MarkSlot::Empty, MarkSlot::Empty]);
    append_one(&wal, 2)?;
    assert_eq!(slots(), [mark(1, 1), MarkSlot::Empty]);
    append_one(&wal, 3)?;
    assert_eq!(slots(), [mark(1, 1), mark(2, 1)]);
    append_one(&wal, 4)?;
    assert_eq!(slots(), [mark(3, 1), mark(2, 1)]);
    // A scan reports the slots' mark as how far the log is known durable.
    let report = kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {})?;
    assert_eq!(report.high_water_lsn.0, 3);
    drop(wal);
    Ok(())
}

/// 60 records appended one sync each (no pause: no SYNCED), then the power goes.
fn steady_then_power_cut(seed: u64) -> Result<(SimStorage, std::path::PathBuf), WalError> {
    let sim = SimStorage::new(seed);
    let (wal, _, _) = open(&sim, steady())?;
    for i in 1..=60 {
        append_one(&wal, i)?;
    }
    drop(wal);
    sim.power_cut();
    let newest = segments(&sim, dir()).pop().expect("a segment");
    Ok((sim, newest))
}

#[test]
fn under_steady_load_synced_frames_cut_off_are_corruption_except_the_last_sync() -> TestResult {
    let (sim, newest) = steady_then_power_cut(2)?;
    let bytes = sim.read_file(&newest).ok_or("newest segment")?;
    assert_eq!(slots_of(&bytes), [mark(59, 1), mark(58, 1)]);
    let frames = data_frames(&bytes);
    assert_eq!(frames.len(), 60);
    let pristine_dir = snapshot(&sim, dir());
    // Outside damage after the crash: every cut inside or at the start of frames 1..=59 (all
    // synced before the last sync) is refused, naming the slot's record.
    assert_frame_cuts_refused(&sim, &newest, &bytes, &frames[..59], &steady());
    // The documented limit: a cut inside the frame of the last sync (LSN 60) cannot be told
    // from a torn write, and is truncated as one.
    let (last_offset, _) = frames[59];
    sim.write_file(&newest, &bytes[..last_offset + 20]);
    let (wal, report, replayed) = open(&sim, steady())?;
    assert_eq!(replayed, expected(59));
    assert_eq!(
        report.torn_tail.map(|t| (t.offset, t.first_lost_lsn.0)),
        Some((last_offset as u64, 60))
    );
    drop(wal);
    // Undamaged, everything is there.
    for (path, file_bytes) in &pristine_dir {
        sim.write_file(path, file_bytes);
    }
    let (_wal, _, replayed) = open(&sim, steady())?;
    assert_eq!(replayed, expected(60));
    Ok(())
}

#[test]
fn a_slot_torn_by_a_crash_is_survived_and_rewritten() -> TestResult {
    // The slot write comes right before the fdatasync that would make it durable; failing
    // that fdatasync and cutting the power leaves the slot new, old, zeroed, garbage or torn.
    let mut torn_seen = 0;
    for seed in 0..64 {
        let sim = SimStorage::new(1000 + seed);
        let (wal, _, _) = open(&sim, steady())?;
        for i in 1..=9 {
            append_one(&wal, i)?;
        }
        sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Sync,
            kind: FaultKind::Eio,
        });
        assert!(append_one(&wal, 10).is_err());
        drop(wal);
        sim.clear_faults();
        sim.power_cut();
        let seg = segments(&sim, dir())[0].clone();
        let found = slots_of(&sim.read_file(&seg).ok_or("segment")?);
        // Record 9's sync wrote 8 into slot 1; record 10's would have written 9 into slot 0.
        assert_eq!(found[1], mark(8, 1), "seed {seed}");
        if found[0] == MarkSlot::Torn {
            torn_seen += 1;
        }
        let (wal, _, replayed) =
            open(&sim, steady()).map_err(|e| format!("seed {seed}: reopen failed: {e}"))?;
        assert!(replayed.len() >= 9, "seed {seed}");
        assert_eq!(replayed, expected(replayed.len() as u64), "seed {seed}");
        // Open rewrote a torn slot as empty, durably.
        let after = slots_of(&sim.read_file(&seg).ok_or("segment")?);
        assert_ne!(after[0], MarkSlot::Torn, "seed {seed}");
        // The log goes on; once sealed, the segment reads back with no damaged slot.
        let n = replayed.len() as u64;
        for i in n + 1..=n + 3 {
            append_one(&wal, i)?;
        }
        wal.close()?;
        let (_wal, report, replayed) = open(&sim, steady())?;
        assert!(report.clean_shutdown);
        assert_eq!(replayed, expected(n + 3));
    }
    assert!(torn_seen > 0, "no seed tore the slot");
    Ok(())
}

#[test]
fn a_damaged_slot_outside_the_newest_segment_or_both_slots_damaged_is_corruption() -> TestResult {
    let sim = SimStorage::new(3);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 4096))?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    wal.close()?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 3);
    let pristine = snapshot(&sim, dir());
    // One slot of a sealed segment: only the newest segment's slots are ever being written.
    flip_bit(&sim, &segs[0], MARK_SLOTS_OFFSET as u64 + 3, 0);
    match open(&sim, WalOptions::default()) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!((file, offset), (segs[0].clone(), MARK_SLOTS_OFFSET as u64));
        }
        other => panic!("a damaged sealed slot was not refused: {other:?}"),
    }
    sim.write_file(&segs[0], &pristine[&segs[0]]);
    // Both slots of the newest segment: a crash tears at most one.
    let newest = segs[segs.len() - 1].clone();
    flip_bit(&sim, &newest, MARK_SLOTS_OFFSET as u64, 1);
    flip_bit(
        &sim,
        &newest,
        (MARK_SLOTS_OFFSET + MARK_SLOT_BYTES) as u64,
        1,
    );
    match kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {}) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!((file, offset), (newest.clone(), MARK_SLOTS_OFFSET as u64));
        }
        other => panic!("two damaged slots were not refused: {other:?}"),
    }
    // A slot with a valid checksum that names another segment: not a torn write.
    let mut bytes = pristine[&newest].clone();
    bytes[MARK_SLOTS_OFFSET..MARK_SLOTS_OFFSET + MARK_SLOT_BYTES]
        .copy_from_slice(&MarkSlot::encode(99, 1));
    sim.write_file(&newest, &bytes);
    match kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {}) {
        Err(WalError::Corrupt { reason, .. }) => assert!(reason.contains("seq 99"), "{reason}"),
        other => panic!("a foreign slot was not refused: {other:?}"),
    }
    Ok(())
}

#[test]
fn a_version_1_log_is_read_appended_to_and_rolls_into_version_2() -> TestResult {
    // A log as version 1 wrote it: META and one segment of 5 records, no slots, no CLOSE.
    let sim = SimStorage::new(4);
    let store_id = [9; 16];
    let records: Vec<(u8, Vec<u8>)> = (1..=5).map(|i| (record_type(i), body(i))).collect();
    let segment = version_1_segment(store_id, &records);
    let seg1 = dir().join(format::segment_file_name(1, kairos_wal::Lsn(1)));
    sim.write_file(&dir().join("META"), &encode_meta(&store_id));
    sim.write_file(&seg1, &segment);
    let (wal, report, replayed) = open(&sim, options(Durability::Sync, 4096))?;
    assert_eq!(replayed, expected(5));
    assert!(report.torn_tail.is_none());
    // Appends continue in the version-1 segment (frames right after its 64-byte header,
    // no slot written), then roll into version-2 segments.
    append_one(&wal, 6)?;
    let bytes = sim.read_file(&seg1).ok_or("segment 1")?;
    assert_eq!(&bytes[..segment.len()], segment.as_slice());
    for i in 7..=200 {
        append_one(&wal, i)?;
    }
    wal.close()?;
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 3);
    for (index, seg) in segs.iter().enumerate() {
        let header = SegmentHeader::decode(&sim.read_file(seg).ok_or("segment")?)?;
        assert_eq!(header.format_version, if index == 0 { 1 } else { 2 });
    }
    let (_wal, report, replayed) = open(&sim, WalOptions::default())?;
    assert!(report.clean_shutdown);
    assert_eq!(replayed, expected(200));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Regressions found by review (session 18).

type Hook = Box<dyn FnOnce() + Send>;

/// Delegates to a SimStorage; the first `len()` of a segment file runs `hook` right after
/// measuring — a reader descheduled at that point while the writer goes on.
#[derive(Clone)]
struct HookStorage {
    inner: SimStorage,
    hook: std::sync::Arc<std::sync::Mutex<Option<Hook>>>,
}

impl std::fmt::Debug for HookStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookStorage")
    }
}

struct HookFile {
    inner: Box<dyn kairos_wal::StorageFile>,
    hook: Option<std::sync::Arc<std::sync::Mutex<Option<Hook>>>>,
}

impl std::fmt::Debug for HookFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HookFile")
    }
}

impl kairos_wal::StorageFile for HookFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn len(&self) -> std::io::Result<u64> {
        let len = self.inner.len()?;
        let hook = self
            .hook
            .as_ref()
            .and_then(|h| h.lock().ok().and_then(|mut h| h.take()));
        if let Some(hook) = hook {
            hook();
        }
        Ok(len)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}

impl kairos_wal::Storage for HookStorage {
    fn allows_timed_io(&self) -> bool {
        self.inner.allows_timed_io()
    }
    fn create_dir_all(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.inner.create_dir_all(p)
    }
    fn open(
        &self,
        p: &std::path::Path,
        mode: kairos_wal::storage::OpenMode,
    ) -> std::io::Result<Box<dyn kairos_wal::StorageFile>> {
        let inner = self.inner.open(p, mode)?;
        let segment = p.to_string_lossy().ends_with(format::SEGMENT_SUFFIX);
        Ok(Box::new(HookFile {
            inner,
            hook: segment.then(|| std::sync::Arc::clone(&self.hook)),
        }))
    }
    fn list(&self, d: &std::path::Path) -> std::io::Result<Vec<String>> {
        self.inner.list(d)
    }
    fn exists(&self, p: &std::path::Path) -> std::io::Result<bool> {
        self.inner.exists(p)
    }
    fn rename(&self, a: &std::path::Path, b: &std::path::Path) -> std::io::Result<()> {
        self.inner.rename(a, b)
    }
    fn remove_file(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.inner.remove_file(p)
    }
    fn sync_dir(&self, p: &std::path::Path) -> std::io::Result<()> {
        self.inner.sync_dir(p)
    }
    fn lock(&self, p: &std::path::Path) -> std::io::Result<Box<dyn kairos_wal::LockGuard>> {
        self.inner.lock(p)
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
}

#[test]
fn regression_an_unlocked_scan_of_a_live_log_is_not_misled_by_a_newer_slot() -> TestResult {
    // The segment's length was measured before its slots were read; two syncs in between put
    // a slot mark past that length, and the scan called a healthy log corrupt.
    let sim = SimStorage::new(21);
    let (wal, _, _) = open(&sim, steady())?;
    for i in 1..=3 {
        append_one(&wal, i)?;
    }
    let wal = std::sync::Arc::new(wal);
    let writer = std::sync::Arc::clone(&wal);
    let storage = HookStorage {
        inner: sim.clone(),
        hook: std::sync::Arc::new(std::sync::Mutex::new(Some(Box::new(move || {
            for i in 4..=5 {
                append_one(&writer, i).expect("append while the scan reads");
            }
        })))),
    };
    let report = kairos_wal::scan(&storage, dir(), 1 << 20, &mut |_| {})?;
    assert!(report.last_lsn.0 >= 3);
    assert_eq!(
        kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {})?
            .last_lsn
            .0,
        5
    );
    Ok(())
}

#[test]
fn regression_a_small_version_1_segment_with_a_damaged_header_is_corruption() -> TestResult {
    // A version-1 segment of up to 128 bytes can hold a record; without a valid header it
    // was taken for an unwritten segment and removed.
    let sim = SimStorage::new(22);
    let store_id = [9; 16];
    let mut segment = version_1_segment(store_id, &[(1, b"precious".to_vec())]);
    assert!(segment.len() <= SEGMENT_FRAMES_OFFSET);
    segment[40] ^= 1;
    let seg1 = dir().join(format::segment_file_name(1, kairos_wal::Lsn(1)));
    sim.write_file(&dir().join("META"), &encode_meta(&store_id));
    sim.write_file(&seg1, &segment);
    match open(&sim, steady()) {
        Err(WalError::Corrupt { file, offset, .. }) => assert_eq!((file, offset), (seg1, 0)),
        other => panic!("a damaged version-1 header was not refused: {other:?}"),
    }
    Ok(())
}

#[test]
fn regression_the_segment_open_creates_past_a_sealed_one_is_on_record() -> TestResult {
    // A roll cut short after its SEAL (the new segment's rename failed): the next open rolls
    // and must record the new segment in SYNCED as a roll does, or deleting it after a later
    // crash loses acknowledged records silently.
    let sim = SimStorage::new(23);
    let opts = || options(Durability::Sync, 4096);
    let (wal, _, _) = open(&sim, opts())?;
    sim.inject(FaultPlan {
        after: 0,
        op: FaultOp::Rename,
        kind: FaultKind::Eio,
    });
    let mut i = 1;
    while append_one(&wal, i).is_ok() {
        i += 1;
        assert!(i < 500, "the roll never came");
    }
    drop(wal);
    sim.clear_faults();
    sim.crash_process();
    let (wal, report, _) = open(&sim, opts())?;
    let sealed_last = report.last_lsn.0;
    assert_eq!(segments(&sim, dir()).len(), 2);
    for k in 1..=20 {
        append_one(&wal, sealed_last + k)?;
    }
    drop(wal);
    sim.crash_process();
    let newest = segments(&sim, dir()).pop().ok_or("no segment")?;
    kairos_wal::Storage::remove_file(&sim, &newest)?;
    match open(&sim, opts()) {
        Err(WalError::MissingSegment { file, .. }) => {
            assert_eq!(file, dir().join(format::SYNCED_FILE_NAME));
        }
        other => panic!("the deleted segment went unnoticed: {other:?}"),
    }
    Ok(())
}

/// Seeds for the power-cut loop below (`KAIROS_TEST_SCALE` multiplies them).
fn power_cut_seeds() -> u64 {
    let scale = std::env::var("KAIROS_TEST_SCALE")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&s| s >= 1)
        .unwrap_or(1);
    300 * scale
}

#[test]
fn power_cuts_and_faults_alone_never_read_as_corruption_or_lose_a_synced_record() -> TestResult {
    // Rounds of appends (4 KiB segments, so rolls and their SYNCED writes happen), an EIO at
    // a seeded operation, a power cut (stale bytes half the time), and every other reopen cut
    // short by a fault of its own (into the slot repair, truncation or roll it does) and
    // another power cut. No round may find Corrupt or MissingSegment, nor lose a record
    // whose sync returned.
    let mut opens = 0;
    for seed in 0..power_cut_seeds() {
        let durability = match seed % 3 {
            0 => Durability::Sync,
            1 => Durability::Interval(std::time::Duration::from_millis(1)),
            _ => Durability::Buffered,
        };
        let opts = || options(durability, 4096);
        let sim = SimStorage::new(5000 + seed);
        sim.set_stale_history(seed % 2 == 0);
        let mut synced = 0;
        for round in 0..4u64 {
            let (wal, report, replayed) = match open(&sim, opts()) {
                Ok(opened) => opened,
                Err(e @ (WalError::Corrupt { .. } | WalError::MissingSegment { .. })) => {
                    panic!("seed {seed} round {round} {durability:?}: {e}")
                }
                Err(e @ (WalError::InvalidOptions { .. } | WalError::Locked { .. })) => {
                    panic!("{e}")
                }
                Err(_) => {
                    // The injected fault hit the open itself (an I/O error, or the poison it
                    // leaves): the power goes again.
                    sim.clear_faults();
                    sim.power_cut();
                    continue;
                }
            };
            opens += 1;
            assert!(
                report.last_lsn.0 >= synced,
                "seed {seed} round {round} {durability:?}: synced LSN {synced} lost ({} left)",
                report.last_lsn.0
            );
            assert_eq!(replayed, expected(report.last_lsn.0), "seed {seed}");
            let mut next = report.last_lsn.0 + 1;
            sim.inject(FaultPlan {
                after: (seed * 7 + round * 13) % 400,
                op: FaultOp::Any,
                kind: FaultKind::Eio,
            });
            for _ in 0..30 + seed % 40 {
                if append_one(&wal, next).is_err() {
                    break;
                }
                next += 1;
                if next % 9 == 0 && wal.sync().is_err() {
                    break;
                }
                synced = synced.max(wal.synced_lsn().0);
            }
            drop(wal);
            sim.clear_faults();
            sim.power_cut();
            if round % 2 == 1 {
                sim.inject(FaultPlan {
                    after: seed % 12,
                    op: FaultOp::Any,
                    kind: FaultKind::Eio,
                });
            }
        }
        sim.clear_faults();
    }
    eprintln!("{opens} opens over {} seeds", power_cut_seeds());
    // Rounds 0, 1 and 3 open; round 2's open meets the fault armed for it.
    assert_eq!(opens, 3 * power_cut_seeds());
    Ok(())
}
