//! Torn tails and corruption, case by case (fjall's journal tests, LevelDB's log_test).
//!
//! A crash may leave the last segment ending in a partial or garbled frame: open truncates it
//! and reports exactly what it cut in `recovery().wal.torn_tail`. A damaged byte anywhere a
//! crash cannot explain — a sealed segment, a cleanly closed log, a frame that later frames
//! prove was synced — is corruption: open fails with `WalError::Corrupt` naming the file and
//! offset, and leaves every byte on disk as it was.

mod common;

use common::{
    by_key, config, frames, fs_segments, key, last_data_frame, payload, FrameAt, SimHarness, Stop,
    TestResult, FRAME_KIND_DATA, START_MS,
};
use kairos::{Durability, Engine, ManualClock, OpenError, TornTail};
use kairos_wal::format::{
    FRAME_FIRST_LSN_OFFSET, FRAME_HEADER_BYTES, SEGMENT_FRAMES_OFFSET, SEGMENT_HEADER_BYTES,
};
use kairos_wal::{Lsn, Storage, WalError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a test damages the last segment after a crash.
#[derive(Debug, Clone, Copy)]
enum Tear {
    /// Cut the file `n` bytes into the last DATA frame.
    CutInto(u64),
    /// Cut the file one byte before the end of the last DATA frame.
    CutOneShort,
    /// Cut the file exactly at the start of the last DATA frame: no torn bytes at all.
    CutAtFrameStart,
    /// Keep every frame; append this many zero bytes (preallocated, never written): cut off
    /// at open, not reported as torn (under `Sync` the log keeps such a tail itself).
    AppendZeros(usize),
    /// Keep every frame; append this many garbage bytes.
    AppendGarbage(usize),
    /// Drop everything after the last DATA frame and flip a byte of its body (a torn sector).
    FlipLastFrameBody,
}

/// What open must report for a tear of a log whose last DATA frame holds LSN `last`.
struct TearOutcome {
    /// The segment after damage.
    image: Vec<u8>,
    /// `Some((offset, bytes_truncated))` if open must truncate.
    truncated: Option<(u64, u64)>,
    /// Whether the last schedule is lost.
    loses_last: bool,
}

fn tear(segment: &[u8], how: Tear) -> TearOutcome {
    // Under `Sync` the segment ends with the zeros the writer keeps ahead of its frames: the
    // tears below start from its last frame's end.
    let frames_end = common::frames(segment)
        .last()
        .map_or(segment.len(), |f| (f.offset + f.bytes) as usize);
    let segment = &segment[..frames_end];
    let f = last_data_frame(segment).expect("the last segment holds a DATA frame");
    let start = f.offset as usize;
    let end = (f.offset + f.bytes) as usize;
    let cut = |len: usize| TearOutcome {
        image: segment[..len].to_vec(),
        truncated: (len > start).then(|| (f.offset, (len - start) as u64)),
        loses_last: true,
    };
    match how {
        Tear::CutInto(n) => cut(start + n as usize),
        Tear::CutOneShort => cut(end - 1),
        Tear::CutAtFrameStart => cut(start),
        Tear::AppendZeros(n) | Tear::AppendGarbage(n) => {
            let byte = if matches!(how, Tear::AppendZeros(_)) {
                0
            } else {
                0xA5
            };
            let mut image = segment.to_vec();
            image.extend(std::iter::repeat_n(byte, n));
            TearOutcome {
                image,
                truncated: (byte != 0).then_some((segment.len() as u64, n as u64)),
                loses_last: false,
            }
        }
        Tear::FlipLastFrameBody => {
            let mut image = segment[..end].to_vec();
            image[end - 3] ^= 0x40;
            TearOutcome {
                image,
                truncated: Some((f.offset, f.bytes)),
                loses_last: true,
            }
        }
    }
}

const TEARS: [Tear; 9] = [
    Tear::CutInto(1),
    Tear::CutInto(10),
    Tear::CutInto(FRAME_HEADER_BYTES as u64),
    Tear::CutInto(FRAME_HEADER_BYTES as u64 + 7),
    Tear::CutOneShort,
    Tear::CutAtFrameStart,
    Tear::AppendZeros(4096),
    Tear::AppendGarbage(100),
    Tear::FlipLastFrameBody,
];

/// Tasks every torn-tail case schedules, one record (LSN) each.
const TORN_TASKS: usize = 25;

/// Checks a reopened engine against a tear: the report, and every surviving task delivered.
fn check_torn_open(
    engine: &Engine,
    clock: &ManualClock,
    segment: &Path,
    how: Tear,
    outcome: &TearOutcome,
) -> TestResult {
    let report = &engine.recovery().wal;
    match (outcome.truncated, &report.torn_tail) {
        (None, None) => {}
        (
            Some((offset, bytes)),
            Some(TornTail {
                file,
                offset: got_offset,
                bytes_truncated,
                first_lost_lsn,
            }),
        ) => {
            assert_eq!(file.file_name(), segment.file_name(), "{how:?}: {report:?}");
            assert_eq!(
                (*got_offset, *bytes_truncated),
                (offset, bytes),
                "{how:?}: {report:?}"
            );
            if outcome.loses_last {
                assert_eq!(
                    *first_lost_lsn,
                    Lsn(TORN_TASKS as u64),
                    "{how:?}: {report:?}"
                );
            }
        }
        (want, got) => {
            return Err(
                format!("{how:?}: expected truncation {want:?}, report says {got:?}").into(),
            )
        }
    }
    let survivors = TORN_TASKS - usize::from(outcome.loses_last);
    assert_eq!(engine.recovery().pending, survivors, "{how:?}");
    clock.advance(Duration::from_secs(3_600));
    let got = by_key(&common::drain(engine)?)?;
    assert_eq!(got, expected_torn_tasks(survivors), "{how:?}");
    Ok(())
}

fn expected_torn_tasks(count: usize) -> common::TaskMap {
    (0..count)
        .map(|i| {
            (
                key("t", i),
                (START_MS + 1_000 + i as u64, payload("torn", i, 60)),
            )
        })
        .collect()
}

/// One segment holds every torn-tail case, so "the last segment" is never a fresh, empty one.
fn torn_config(case: usize) -> kairos::Config {
    let mut c = config(durability_for(case));
    c.segment_bytes = 1 << 20;
    // The cut below hits synced frames (the Sync cases): with the idle high-water mark they
    // would be refused as damage once the engine idled 10 ms before its drop, and with proof
    // before acknowledgement (the default) at once — these cases are about the torn tail a
    // crash leaves, not about outside damage (`tests/proof.rs` has those).
    c.synced_mark_delay = None;
    c.proof_before_ack = false;
    c
}

fn schedule_torn_tasks(engine: &Engine) -> TestResult {
    for i in 0..TORN_TASKS {
        engine.schedule_after(
            &key("t", i),
            Duration::from_millis(1_000 + i as u64),
            &payload("torn", i, 60),
        )?;
    }
    Ok(())
}

#[test]
fn torn_tail_after_process_crash_is_truncated_and_reported_sim() -> TestResult {
    for (case, how) in TEARS.into_iter().enumerate() {
        let mut h = SimHarness::new(case as u64, torn_config(case))?;
        schedule_torn_tasks(h.engine())?;
        h.stop(Stop::ProcessCrash)?;
        let segment = h.segments()?.pop().ok_or("no segment")?;
        let before = h.sim.read_file(&segment).ok_or("segment vanished")?;
        let outcome = tear(&before, how);
        h.sim.write_file(&segment, &outcome.image);

        h.start()?;
        check_torn_open(h.engine(), &h.clock, &segment, how, &outcome)?;
        // Truncated once, reported once: the next open finds a healthy log.
        h.restart(Stop::Clean)?;
        assert_eq!(h.engine().recovery().wal.torn_tail, None, "{how:?}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}

/// Alternates Sync and Buffered: the frames differ (marks of synced LSNs), the rule does not.
fn durability_for(case: usize) -> Durability {
    if case.is_multiple_of(2) {
        Durability::Sync
    } else {
        Durability::Buffered
    }
}

#[test]
fn torn_tail_after_crash_is_truncated_and_reported_fs() -> TestResult {
    for (case, how) in TEARS.into_iter().enumerate() {
        let dir = tempfile::tempdir()?;
        let clock = ManualClock::new(START_MS);
        let open = || common::open_fs(dir.path(), torn_config(case), &clock);
        let engine = open()?;
        schedule_torn_tasks(&engine)?;
        drop(engine); // no shutdown: a crash as far as the log knows
        let segment = fs_segments(&dir.path().join("wal"))?
            .pop()
            .ok_or("no segment")?;
        let before = std::fs::read(&segment)?;
        let outcome = tear(&before, how);
        std::fs::write(&segment, &outcome.image)?;

        let engine = open()?;
        check_torn_open(&engine, &clock, &segment, how, &outcome)?;
        engine.shutdown()?;
        drop(engine);
        let engine = open()?;
        assert_eq!(engine.recovery().wal.torn_tail, None, "{how:?}");
        engine.shutdown()?;
    }
    Ok(())
}

/// A log with several segments, `tasks` schedules of ~150-byte payloads, stopped as `how`.
fn build_log(seed: u64, tasks: usize, how: Stop) -> TestResult<SimHarness> {
    let mut h = SimHarness::new(seed, config(Durability::Sync))?;
    for i in 0..tasks {
        h.engine().schedule_after(
            &key("c", i),
            Duration::from_secs(10 + i as u64),
            &payload("corrupt", i, 150),
        )?;
    }
    h.stop(how)?;
    Ok(h)
}

/// Every file under the data directory, name → bytes.
fn snapshot(h: &SimHarness) -> TestResult<BTreeMap<PathBuf, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for dir in [h.dir.clone(), h.wal_dir()] {
        for name in h.sim.list(&dir)? {
            let path = dir.join(name);
            let bytes = h.sim.read_file(&path).ok_or("listed file vanished")?;
            out.insert(path, bytes);
        }
    }
    Ok(out)
}

fn flip_byte(h: &SimHarness, path: &Path, at: u64) -> TestResult {
    let mut bytes = h.sim.read_file(path).ok_or("no such file")?;
    bytes[at as usize] ^= 0x10;
    h.sim.write_file(path, &bytes);
    Ok(())
}

/// Flips the byte at `at` of `segment`, expects open to fail with `Corrupt` naming the
/// segment and an offset in `offsets`, and expects every file unchanged by the failed open.
/// Then restores the byte and checks every task is still there.
fn expect_corrupt(
    h: &mut SimHarness,
    segment: &Path,
    at: u64,
    offsets: std::ops::RangeInclusive<u64>,
    tasks: usize,
) -> TestResult {
    flip_byte(h, segment, at)?;
    let before = snapshot(h)?;
    match h.open() {
        Err(OpenError::Wal(WalError::Corrupt {
            file,
            offset,
            reason,
        })) => {
            assert_eq!(
                file.file_name(),
                segment.file_name(),
                "flip at {at}: wrong file in Corrupt ({reason})"
            );
            assert!(
                offsets.contains(&offset),
                "flip at {at} of {segment:?}: Corrupt at offset {offset}, expected {offsets:?} ({reason})"
            );
        }
        Err(other) => {
            return Err(
                format!("flip at {at} of {segment:?}: expected Corrupt, got {other:?}").into(),
            )
        }
        Ok(engine) => {
            let r = engine.recovery().clone();
            drop(engine);
            return Err(format!("flip at {at} of {segment:?}: open succeeded: {r:?}").into());
        }
    }
    assert!(
        snapshot(h)? == before,
        "a failed open changed files on disk"
    );
    flip_byte(h, segment, at)?;
    h.start()?;
    assert_eq!(
        h.engine().recovery().pending,
        tasks,
        "restored log lost tasks"
    );
    h.stop(Stop::Clean)?;
    Ok(())
}

/// The middle DATA frame of a segment image, if it holds at least three.
fn middle_data_frame(frames: &[FrameAt]) -> Option<FrameAt> {
    let data: Vec<&FrameAt> = frames
        .iter()
        .filter(|f| f.kind == FRAME_KIND_DATA)
        .collect();
    (data.len() >= 3).then(|| *data[data.len() / 2])
}

#[test]
fn corrupt_sealed_segment_is_refused_with_file_and_offset() -> TestResult {
    const TASKS: usize = 60;
    for (case, how) in [Stop::Clean, Stop::ProcessCrash, Stop::PowerCut]
        .into_iter()
        .enumerate()
    {
        let seed = 100 + case as u64;
        let mut h = build_log(seed, TASKS, how)?;
        let segments = h.segments()?;
        assert!(
            segments.len() >= 3,
            "want several segments, got {segments:?}"
        );
        let image = h.sim.read_file(&segments[0]).ok_or("no segment")?;
        let f = middle_data_frame(&frames(&image)).ok_or("too few frames")?;

        // A byte in the middle of a record body.
        let body_at = f.offset + f.bytes / 2 + 8;
        expect_corrupt(&mut h, &segments[0], body_at, f.offset..=body_at, TASKS)?;
        // A frame header field (first_lsn) of a frame in a middle segment.
        let image = h.sim.read_file(&segments[1]).ok_or("no segment")?;
        let g = middle_data_frame(&frames(&image)).ok_or("too few frames")?;
        let at = g.offset + FRAME_FIRST_LSN_OFFSET as u64;
        expect_corrupt(&mut h, &segments[1], at, g.offset..=at, TASKS)?;
        // The segment header (its `created_ms`, covered by the header CRC).
        expect_corrupt(
            &mut h,
            &segments[0],
            50,
            0..=SEGMENT_HEADER_BYTES as u64,
            TASKS,
        )?;
    }
    Ok(())
}

#[test]
fn corrupt_last_segment_of_cleanly_closed_log_is_refused() -> TestResult {
    const TASKS: usize = 40;
    let mut h = build_log(7, TASKS, Stop::Clean)?;
    let last = h.segments()?.pop().ok_or("no segment")?;
    let image = h.sim.read_file(&last).ok_or("no segment")?;
    let all = frames(&image);
    // A frame in the middle of the last segment, valid frames after it.
    let f = middle_data_frame(&all).ok_or("too few frames in the last segment")?;
    let at = f.offset + f.bytes - 2;
    expect_corrupt(&mut h, &last, at, f.offset..=at, TASKS)?;
    // The last DATA frame, followed only by the close marker.
    let last = h.segments()?.pop().ok_or("no segment")?;
    let image = h.sim.read_file(&last).ok_or("no segment")?;
    let f = last_data_frame(&image).ok_or("no data frame")?;
    let at = f.offset + FRAME_HEADER_BYTES as u64 + 3;
    expect_corrupt(&mut h, &last, at, f.offset..=at, TASKS)?;
    Ok(())
}

#[test]
fn corrupt_synced_frame_in_last_segment_after_crash_is_refused() -> TestResult {
    // Under Sync each frame's header records the LSN synced when it was written, so a damaged
    // frame followed by frames that prove it was synced cannot be a torn write.
    const TASKS: usize = 40;
    let mut h = build_log(8, TASKS, Stop::ProcessCrash)?;
    let last = h.segments()?.pop().ok_or("no segment")?;
    let image = h.sim.read_file(&last).ok_or("no segment")?;
    let f = middle_data_frame(&frames(&image)).ok_or("too few frames in the last segment")?;
    let at = f.offset + f.bytes - 2;
    expect_corrupt(&mut h, &last, at, f.offset..=at, TASKS)
}

#[test]
fn corrupt_sealed_segment_on_real_disk_is_refused_and_left_untouched() -> TestResult {
    const TASKS: usize = 50;
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(START_MS);
    let open = || common::open_fs(dir.path(), config(Durability::Buffered), &clock);
    let engine = open()?;
    for i in 0..TASKS {
        engine.schedule_after(&key("c", i), Duration::from_secs(5), &payload("fs", i, 150))?;
    }
    engine.shutdown()?;
    drop(engine);
    let segments = fs_segments(&dir.path().join("wal"))?;
    assert!(segments.len() >= 2, "{segments:?}");
    let mut image = std::fs::read(&segments[0])?;
    let f = middle_data_frame(&frames(&image)).ok_or("too few frames")?;
    let at = (f.offset + f.bytes / 2) as usize;
    image[at] ^= 0x01;
    std::fs::write(&segments[0], &image)?;
    let read_all =
        || -> TestResult<Vec<Vec<u8>>> { segments.iter().map(|s| Ok(std::fs::read(s)?)).collect() };
    let before = read_all()?;
    match open() {
        Err(OpenError::Wal(WalError::Corrupt { file, offset, .. })) => {
            assert_eq!(file.file_name(), segments[0].file_name());
            assert!(
                (f.offset..=at as u64).contains(&offset),
                "offset {offset}, frame {f:?}"
            );
        }
        other => {
            return Err(format!(
                "expected Corrupt, got {:?}",
                other.map(|e| e.recovery().clone())
            )
            .into())
        }
    }
    assert!(read_all()? == before, "a failed open changed segment bytes");
    assert_eq!(fs_segments(&dir.path().join("wal"))?, segments);
    image[at] ^= 0x01;
    std::fs::write(&segments[0], &image)?;
    let engine = open()?;
    assert_eq!(engine.recovery().pending, TASKS);
    engine.shutdown()?;
    Ok(())
}

/// A crash right after a roll can leave the newest segment without a complete header (its
/// bytes were never synced under `Buffered`). Open must accept that as an unwritten segment,
/// keep everything in the older segments, and go on writing. A leftover `*.tmp` file is
/// removed.
#[test]
fn newest_segment_without_a_header_after_a_crash_is_recovered() -> TestResult {
    type Damage = fn(&[u8]) -> Vec<u8>;
    let cases: [(&str, Damage); 5] = [
        ("empty", |_| Vec::new()),
        ("half a header", |b| b[..30].to_vec()),
        ("zeroed header", |_| vec![0; SEGMENT_HEADER_BYTES]),
        ("header only", |b| b[..SEGMENT_HEADER_BYTES].to_vec()),
        // Header and (empty: no sync since the roll) mark slots, no frame.
        ("header and mark slots only", |b| {
            b[..SEGMENT_FRAMES_OFFSET].to_vec()
        }),
    ];
    for (case, (name, damage)) in cases.into_iter().enumerate() {
        // Without proof before acknowledgement, whose roll records the new segment in SYNCED:
        // its header was then durable, and this damage is refused (`tests/proof.rs`).
        let mut config = config(Durability::Buffered);
        config.proof_before_ack = false;
        let mut h = SimHarness::new(300 + case as u64, config)?;
        let mut scheduled = 0;
        while h.segments()?.len() < 3 {
            h.engine().schedule_after(
                &key("n", scheduled),
                Duration::from_secs(60),
                &payload("newest", scheduled, 150),
            )?;
            scheduled += 1;
        }
        h.stop(Stop::ProcessCrash)?;
        let newest = h.segments()?.pop().ok_or("no segment")?;
        let survivors = (common::first_lsn_of(&newest)? - 1) as usize;
        let image = h.sim.read_file(&newest).ok_or("no segment")?;
        h.sim.write_file(&newest, &damage(&image));
        h.sim.write_file(
            &h.wal_dir()
                .join("0000000000000009-0000000000000009.seg.tmp"),
            b"junk",
        );

        h.start().map_err(|e| format!("{name}: open failed: {e}"))?;
        assert_eq!(h.engine().recovery().pending, survivors, "{name}");
        assert!(
            !h.sim
                .list(&h.wal_dir())?
                .iter()
                .any(|n| n.ends_with(".tmp")),
            "{name}: leftover .tmp kept"
        );
        // The log goes on: a new task survives the next crash, and everything fires.
        h.engine()
            .schedule_after(b"after", Duration::from_secs(1), b"a")?;
        h.restart(Stop::ProcessCrash)?;
        h.clock.advance(Duration::from_secs(61));
        let got = by_key(&common::drain(h.engine())?)?;
        let mut expected: common::TaskMap = (0..survivors)
            .map(|i| (key("n", i), (START_MS + 60_000, payload("newest", i, 150))))
            .collect();
        expected.insert(b"after".to_vec(), (START_MS + 1_000, b"a".to_vec()));
        assert_eq!(got, expected, "{name}");
        h.stop(Stop::Clean)?;
    }
    Ok(())
}
