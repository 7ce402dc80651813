//! The zeros a `Sync` writer keeps written ahead of its frames (`wal/FORMAT.md`, "Writing
//! rules"): appends then overwrite bytes of the file instead of extending it, so their
//! fdatasyncs commit no new file size. A roll or a clean close cuts the zeros off (a sealed or
//! closed segment ends with its last frame); after a crash, open cuts them off without calling
//! them a torn tail; zeros where a durable record was are still corruption; `Buffered` and
//! `Interval` keep none.

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
