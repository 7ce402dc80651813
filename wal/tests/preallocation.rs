//! The zeros a `Sync` writer keeps written ahead of its frames (`wal/FORMAT.md`, "Writing
//! rules"): appends then overwrite bytes of the file instead of extending it, so their
//! fdatasyncs commit no new file size. A roll or a clean close cuts the zeros off (a sealed or
//! closed segment ends with its last frame); after a crash, open cuts them off without calling
//! them a torn tail; zeros where a durable record was are still corruption; `Buffered` and
//! `Interval` keep none; a disk with room for the frames but not for the zeros takes the append
//! all the same (`SimStorage::set_free_bytes`).

mod common;

use common::*;
use kairos_wal::{Durability, SimStorage, WalError, WalOptions};

/// Bytes the writer keeps ahead (the library's `PREALLOCATE_BYTES`).
const AHEAD: usize = 64 * 1024;

fn newest(sim: &SimStorage) -> Result<(std::path::PathBuf, Vec<u8>), Box<dyn std::error::Error>> {
    let seg = segments(sim, dir()).pop().ok_or("no segment")?;
    let bytes = sim.read_file(&seg).ok_or("segment vanished")?;
    Ok((seg, bytes))
}

#[test]
fn sync_appends_write_into_zeros_kept_ahead_of_the_frames() -> TestResult {
    let sim = SimStorage::new(71);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    append_one(&wal, 1)?;
    let (_, first) = newest(&sim)?;
    let end = frames_end(&first);
    // One append extended the file by its frame and the zeros ahead of it (a MARK frame
    // written after its sync went into them too).
    let (at, _) = data_frames(&first[..end])[0];
    let data_end = at + data_frame_bytes(body(1).len()) as usize;
    assert_eq!(
        first.len(),
        data_end + AHEAD,
        "file length after the first append"
    );
    assert!(first[end..].iter().all(|&b| b == 0));
    for i in 2..=20 {
        append_one(&wal, i)?;
    }
    let (_, later) = newest(&sim)?;
    // The next appends went into those zeros: the file did not grow.
    assert_eq!(later.len(), first.len());
    assert!(frames_end(&later) > end);
    Ok(())
}

#[test]
fn roll_and_clean_close_cut_the_zeros_off() -> TestResult {
    let sim = SimStorage::new(72);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 4096))?;
    for i in 1..=200 {
        append_one(&wal, i)?;
    }
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 3, "the appends rolled: {segs:?}");
    for seg in &segs[..segs.len() - 1] {
        let bytes = sim.read_file(seg).ok_or("segment vanished")?;
        assert_eq!(
            bytes.len(),
            frames_end(&bytes),
            "sealed {seg:?} ends with its SEAL"
        );
    }
    let (_, active) = newest(&sim)?;
    assert!(
        active.len() > frames_end(&active),
        "the active segment keeps zeros ahead"
    );
    // Zeros never go past the segment size.
    assert_eq!(active.len(), 4096);
    wal.close()?;
    let (_, closed) = newest(&sim)?;
    assert_eq!(
        closed.len(),
        frames_end(&closed),
        "a closed segment ends with its CLOSE"
    );
    let (_, report, replayed) = open(&sim, WalOptions::default())?;
    assert!(report.clean_shutdown);
    assert_eq!(replayed, expected(200));
    Ok(())
}

#[test]
fn after_a_crash_open_cuts_the_zeros_off_without_reporting_a_torn_tail() -> TestResult {
    for power_cut in [false, true] {
        let sim = SimStorage::new(73);
        let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
        for i in 1..=10 {
            append_one(&wal, i)?;
        }
        if power_cut {
            sim.power_cut_drop_unsynced();
        } else {
            sim.crash_process();
        }
        drop(wal);
        let (seg, before) = newest(&sim)?;
        let end = frames_end(&before);
        assert!(before.len() > end, "zeros ahead of the frames at the crash");

        let scanned = kairos_wal::scan(&sim, dir(), 1 << 20, &mut |_| {})?;
        assert_eq!(scanned.torn_tail, None, "power cut {power_cut}");
        let (wal, report, replayed) = open(&sim, options(Durability::Sync, 1 << 20))?;
        assert_eq!(report.torn_tail, None, "power cut {power_cut}");
        assert!(!report.clean_shutdown);
        assert_eq!(replayed, expected(10), "power cut {power_cut}");
        // Open cut the zeros off (the frames after the crash's end may differ: a MARK).
        let reopened = sim.read_file(&seg).ok_or("segment vanished")?;
        assert_eq!(
            reopened.len(),
            frames_end(&reopened),
            "power cut {power_cut}"
        );
        assert_eq!(
            append_one(&wal, 11)?,
            11,
            "the next append takes the next LSN"
        );
        wal.close()?;
        let (_, _, replayed) = open(&sim, WalOptions::default())?;
        assert_eq!(replayed, expected(11), "power cut {power_cut}");
    }
    Ok(())
}

/// Zeros are not a free pass: acknowledged (proven) records zeroed out, with the zeros
/// running to the end of the file as a preallocated tail does, are corruption.
#[test]
fn zeros_over_durable_records_are_corrupt() -> TestResult {
    let sim = SimStorage::new(74);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    for i in 1..=10 {
        append_one(&wal, i)?;
    }
    sim.crash_process();
    drop(wal);
    let (seg, mut bytes) = newest(&sim)?;
    let frames = data_frames(&bytes[..frames_end(&bytes)]);
    let (at, lsn) = *frames.last().ok_or("no data frame")?;
    assert_eq!(lsn, 10);
    bytes[at..].fill(0);
    sim.write_file(&seg, &bytes);
    let before = snapshot(&sim, dir());
    match open(&sim, WalOptions::default()) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!((file, offset), (seg, at as u64));
        }
        other => return Err(format!("expected Corrupt, got {other:?}").into()),
    }
    assert_eq!(
        snapshot(&sim, dir()),
        before,
        "a refused open changes nothing"
    );
    Ok(())
}

#[test]
fn buffered_and_interval_keep_no_zeros_ahead() -> TestResult {
    for durability in [
        Durability::Buffered,
        Durability::Interval(std::time::Duration::from_millis(1)),
    ] {
        let sim = SimStorage::new(75);
        let (wal, _, _) = open(&sim, options(durability, 1 << 20))?;
        for i in 1..=10 {
            append_one(&wal, i)?;
        }
        wal.sync()?;
        let (_, bytes) = newest(&sim)?;
        assert_eq!(bytes.len(), frames_end(&bytes), "{durability:?}");
        drop(wal);
    }
    Ok(())
}

/// A large write extends the file by itself: no zeros after it.
#[test]
fn a_large_write_writes_no_zeros_ahead() -> TestResult {
    let sim = SimStorage::new(76);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    let big = vec![7u8; 20 * 1024];
    wal.append(&[kairos_wal::Record {
        record_type: 1,
        body: &big,
    }])?
    .wait()?;
    let (_, bytes) = newest(&sim)?;
    assert_eq!(bytes.len(), frames_end(&bytes));
    Ok(())
}

/// Segment size of the full-disk tests: the zeros ahead of the first frame reach its end.
const FULL_DISK_SEGMENT: u64 = 64 * 1024;

/// Room for the first frame and a few more, not for the zeros ahead of it.
const ROOM: u64 = 4096;

/// A `Sync` log on a disk with [`ROOM`] bytes free once it is open, holding records 1..=10
/// (`append_one`); returns the log, the newest segment's path and its length before them.
fn full_disk_log(
    sim: &SimStorage,
) -> Result<(kairos_wal::Wal, std::path::PathBuf, usize), Box<dyn std::error::Error>> {
    let (wal, _, _) = open(sim, options(Durability::Sync, FULL_DISK_SEGMENT))?;
    let (seg, fresh) = newest(sim)?;
    sim.set_free_bytes(Some(ROOM));
    // The first append extends the file: its frame fits, the 64 KiB of zeros after it do not.
    assert_eq!(append_one(&wal, 1)?, 1, "an append whose frame fits");
    assert_eq!(
        wal.poisoned(),
        None,
        "the zeros that did not fit poison nothing"
    );
    let (_, bytes) = newest(sim)?;
    // What fitted of the zeros was written (the file ends in zeros): the disk is full.
    assert_eq!(bytes.len(), fresh.len() + ROOM as usize);
    assert_eq!(sim.free_bytes(), Some(0));
    assert!(bytes[frames_end(&bytes)..].iter().all(|&b| b == 0));
    // The appends after it go into those zeros.
    for i in 2..=10 {
        assert_eq!(append_one(&wal, i)?, i);
    }
    assert_eq!(wal.poisoned(), None);
    let (_, bytes) = newest(sim)?;
    assert_eq!(
        bytes.len(),
        fresh.len() + ROOM as usize,
        "the file did not grow"
    );
    Ok((wal, seg, fresh.len()))
}

/// A full disk with room for a `Sync` append's frame but not for the zeros the writer puts
/// ahead of it (`wal/FORMAT.md`, "Writing rules", preallocation): the append is taken and
/// durable, the log is not poisoned, and what fitted of the zeros is kept ahead. The disk
/// stays full through a crash or power cut: open cuts the zeros off, and the room they gave
/// back takes the next append.
#[test]
fn a_disk_with_room_for_the_frames_but_not_the_zeros_ahead_takes_the_append() -> TestResult {
    for (how, seed) in [(0, 80), (1, 80), (2, 80), (2, 81), (2, 82)] {
        let sim = SimStorage::new(seed);
        let (wal, seg, _) = full_disk_log(&sim)?;
        match how {
            0 => sim.crash_process(),
            1 => sim.power_cut_drop_unsynced(),
            _ => sim.power_cut(),
        }
        drop(wal);
        let what = format!("cut {how}, seed {seed}");
        let (wal, report, replayed) = open(&sim, options(Durability::Sync, FULL_DISK_SEGMENT))
            .map_err(|e| format!("{what}: reopen on the full disk: {e}"))?;
        assert_eq!(replayed, expected(10), "{what}");
        if how < 2 {
            // (A random power cut may tear the MARK frame written after the last sync.)
            assert_eq!(report.torn_tail, None, "{what}");
        }
        let bytes = sim.read_file(&seg).ok_or("segment vanished")?;
        assert_eq!(
            bytes.len(),
            frames_end(&bytes),
            "{what}: open cut the zeros off"
        );
        // The bytes the zeros took are room again: the next append's frame fits (and what
        // fits of its zeros ahead is written).
        assert_eq!(append_one(&wal, 11)?, 11, "{what}");
        assert_eq!(wal.poisoned(), None, "{what}");
        drop(wal);
        sim.power_cut_drop_unsynced();
        sim.set_free_bytes(None);
        let (_, _, replayed) = open(&sim, WalOptions::default())?;
        assert_eq!(replayed, expected(11), "{what}");
    }
    Ok(())
}

/// The same log goes on once room is made: a record too large for what is left of the
/// segment rolls it while the writer still counts zeros ahead up to the segment's end that
/// never got written (the roll cuts off the part that did: the sealed segment ends with its
/// SEAL); small appends roll again, keep zeros ahead in the newest segment, and a clean
/// close and a reopen keep everything.
#[test]
fn after_zeros_ahead_that_did_not_fit_appends_roll_close_and_reopen() -> TestResult {
    let sim = SimStorage::new(83);
    let (wal, seg, _) = full_disk_log(&sim)?;
    sim.set_free_bytes(Some(1 << 20));
    let big = vec![0xB1; 63 * 1024 + 512];
    assert_eq!(append_body(&wal, 11, &big)?, 11);
    let segs = segments(&sim, dir());
    assert_eq!(segs.len(), 2, "the large record rolled");
    assert_eq!(segs[0], seg);
    let sealed = sim.read_file(&seg).ok_or("segment vanished")?;
    assert_eq!(
        sealed.len(),
        frames_end(&sealed),
        "the sealed segment ends with its SEAL"
    );
    let mut want = expected(10);
    want.push((11, record_type(11), big));
    for i in 12..=700 {
        assert_eq!(append_one(&wal, i)?, i);
        want.push((i, record_type(i), body(i)));
    }
    assert_eq!(wal.poisoned(), None);
    let segs = segments(&sim, dir());
    assert!(segs.len() >= 4, "the small appends rolled too: {segs:?}");
    let (_, active) = newest(&sim)?;
    assert!(active.len() > frames_end(&active), "zeros ahead again");
    wal.close()?;
    for seg in segments(&sim, dir()) {
        let bytes = sim.read_file(&seg).ok_or("segment vanished")?;
        assert_eq!(
            bytes.len(),
            frames_end(&bytes),
            "{seg:?} ends with its last frame"
        );
    }
    let (wal, report, replayed) = open(&sim, options(Durability::Sync, FULL_DISK_SEGMENT))?;
    assert!(report.clean_shutdown);
    assert_eq!(report.torn_tail, None);
    assert_eq!(replayed, want);
    assert_eq!(append_one(&wal, 701)?, 701);
    Ok(())
}
