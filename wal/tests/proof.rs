//! Proof before acknowledgement (`WalOptions::proof_before_ack`, the default;
//! `wal/FORMAT.md`, "Proof before acknowledgement"): an append's wait under `Sync`, and every
//! `Wal::sync`, returns only once a durable mark that no cut of the tail removes — a mark slot,
//! a sealed segment, `SYNCED` — covers it. So after an unclean shutdown, outside damage that
//! drops an acknowledged record is refused as corruption, the last group commit's records
//! included; only records never acknowledged can go as a torn tail.

mod common;

use common::*;
use kairos_wal::format::{self, encode_meta, Synced, SEGMENT_FRAMES_OFFSET, SYNCED_FILE_NAME};
use kairos_wal::{
    Durability, FaultKind, FaultOp, FaultPlan, SimStorage, Storage, WalError, WalOptions,
};
use std::time::Duration;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The default options (proof on) without the idle high-water mark, in `segment_bytes`
/// segments: what is proven here is proven by the slots, the seals and the rolls alone.
fn proven(durability: Durability, segment_bytes: u64) -> WalOptions {
    WalOptions {
        synced_mark_delay: None,
        ..options(durability, segment_bytes)
    }
}

fn synced_file(sim: &SimStorage) -> Option<Synced> {
    sim.read_file(&dir().join(SYNCED_FILE_NAME))
        .and_then(|bytes| Synced::decode(&bytes).ok())
}

#[test]
fn every_acknowledged_append_is_on_record_in_a_mark_slot_when_its_wait_returns() -> TestResult {
    let sim = SimStorage::new(1);
    let (wal, _, _) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    let seg = segments(&sim, dir())[0].clone();
    for i in 1..=20 {
        append_one(&wal, i)?;
        // Durable, not just written, when the wait returned.
        let bytes = sim.read_durable_file(&seg).ok_or("segment")?;
        assert_eq!(slots_mark(&bytes), i, "append {i}");
        assert_eq!(wal.synced_lsn().0, i);
    }
    // A lone appender pays the second fdatasync: two per append.
    let before = sim.sync_count();
    append_one(&wal, 21)?;
    assert_eq!(sim.sync_count() - before, 2);
    drop(wal);
    // Without proof, one sync per append, and the slot one behind.
    let sim = SimStorage::new(2);
    let unproven = WalOptions {
        proof_before_ack: false,
        ..proven(Durability::Sync, 1 << 20)
    };
    let (wal, _, _) = open(&sim, unproven)?;
    let seg = segments(&sim, dir())[0].clone();
    for i in 1..=3 {
        append_one(&wal, i)?;
    }
    let before = sim.sync_count();
    append_one(&wal, 4)?;
    assert_eq!(sim.sync_count() - before, 1);
    assert_eq!(slots_mark(&sim.read_file(&seg).ok_or("segment")?), 3);
    Ok(())
}

#[test]
fn any_cut_of_acknowledged_frames_after_a_crash_is_corruption_the_last_sync_included() -> TestResult
{
    let sim = SimStorage::new(3);
    let (wal, _, _) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    for i in 1..=60 {
        append_one(&wal, i)?;
    }
    drop(wal);
    sim.power_cut();
    let newest = segments(&sim, dir()).pop().ok_or("a segment")?;
    let bytes = sim.read_file(&newest).ok_or("newest segment")?;
    assert_eq!(slots_mark(&bytes), 60);
    let frames = data_frames(&bytes);
    assert_eq!(frames.len(), 60);
    let pristine = snapshot(&sim, dir());
    // Every cut at the start of, or inside, any acknowledged frame — the last one too, which
    // without proof reads as a torn write (`mark_slots.rs`) — is refused, naming the frame.
    assert_frame_cuts_refused(
        &sim,
        &newest,
        &bytes,
        &frames,
        &proven(Durability::Sync, 1 << 20),
    );
    for (path, file_bytes) in &pristine {
        sim.write_file(path, file_bytes);
    }
    let (_wal, report, replayed) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    assert!(report.torn_tail.is_none());
    assert_eq!(replayed, expected(60));
    Ok(())
}

#[test]
fn a_torn_tail_of_unacknowledged_records_is_still_truncated() -> TestResult {
    // Records 1..=10 acknowledged under Sync; 11..=30 appended under Buffered (acknowledged as
    // written, never as durable), then the power goes: whatever of them is lost or torn is
    // truncated and reported, never refused.
    for seed in 0..40 {
        let sim = SimStorage::new(100 + seed);
        let (wal, _, _) = open(&sim, proven(Durability::Sync, 1 << 20))?;
        for i in 1..=10 {
            append_one(&wal, i)?;
        }
        drop(wal);
        let (wal, _, _) = open(&sim, proven(Durability::Buffered, 1 << 20))?;
        for i in 11..=30 {
            append_one(&wal, i)?;
        }
        drop(wal);
        sim.power_cut();
        let (_wal, _, replayed) = open(&sim, proven(Durability::Sync, 1 << 20))
            .map_err(|e| format!("seed {seed}: {e}"))?;
        assert_prefix(&replayed, 10, 30);
    }
    Ok(())
}

#[test]
fn deleting_or_emptying_the_newest_segment_after_a_crash_is_refused_in_every_mode() -> TestResult {
    for durability in [
        Durability::Sync,
        Durability::Interval(Duration::from_millis(5)),
        Durability::Buffered,
    ] {
        // 120 appends roll 4 KiB segments; the last `Wal::sync` (any mode) acknowledges all.
        let sim = SimStorage::new(7);
        let (wal, _, _) = open(&sim, proven(durability, 4096))?;
        for i in 1..=120 {
            append_one(&wal, i)?;
        }
        wal.sync()?;
        let newest = segments(&sim, dir()).pop().ok_or("a segment")?;
        let name = newest.file_name().ok_or("a name")?.to_string_lossy();
        let (seq, _) = format::parse_segment_file_name(&name).ok_or("segment name")?;
        assert!(seq >= 3, "{durability:?}: 120 appends did not roll");
        // Each roll put its new segment on record.
        assert_eq!(
            synced_file(&sim).map(|s| s.seq),
            Some(seq),
            "{durability:?}"
        );
        drop(wal);
        sim.power_cut();
        let crashed = snapshot(&sim, dir());

        sim.remove_file(&newest)?;
        match open(&sim, WalOptions::default()) {
            Err(WalError::MissingSegment { file, reason }) => {
                assert_eq!(file, dir().join(SYNCED_FILE_NAME));
                assert!(reason.contains(&format!("seq {seq}")), "{reason}");
            }
            other => panic!("{durability:?}: deleted newest segment: {other:?}"),
        }
        sim.write_file(&newest, b"");
        match open(&sim, WalOptions::default()) {
            Err(WalError::Corrupt { file, .. }) => assert_eq!(file, newest),
            other => panic!("{durability:?}: emptied newest segment: {other:?}"),
        }
        for (path, bytes) in &crashed {
            sim.write_file(path, bytes);
        }
        let (_wal, _, replayed) = open(&sim, WalOptions::default())?;
        assert_eq!(replayed, expected(120), "{durability:?}");
    }
    Ok(())
}

#[test]
fn a_new_logs_first_segment_is_on_record_so_losing_it_is_refused() -> TestResult {
    let sim = SimStorage::new(8);
    let (wal, _, _) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    let first = segments(&sim, dir())[0].clone();
    assert_eq!(
        synced_file(&sim).map(|s| (s.seq, s.synced_lsn.0)),
        Some((1, 0))
    );
    for i in 1..=5 {
        append_one(&wal, i)?;
    }
    drop(wal);
    sim.power_cut();
    sim.remove_file(&first)?;
    let result = open(&sim, WalOptions::default());
    assert!(
        matches!(&result, Err(WalError::MissingSegment { .. })),
        "{:?}",
        result.map(|(_, r, _)| r)
    );
    Ok(())
}

#[test]
fn wal_sync_is_proven_under_interval_and_buffered() -> TestResult {
    for durability in [
        Durability::Interval(Duration::from_secs(3600)),
        Durability::Buffered,
    ] {
        let sim = SimStorage::new(9);
        let (wal, _, _) = open(&sim, proven(durability, 1 << 20))?;
        for i in 1..=10 {
            append_one(&wal, i)?;
        }
        wal.sync()?;
        let seg = segments(&sim, dir())[0].clone();
        assert_eq!(
            slots_mark(&sim.read_durable_file(&seg).ok_or("segment")?),
            10
        );
        drop(wal);
        sim.power_cut();
        let bytes = sim.read_file(&seg).ok_or("segment")?;
        let (last, _) = *data_frames(&bytes).last().ok_or("a frame")?;
        sim.write_file(&seg, &bytes[..last + 1]);
        let result = open(&sim, WalOptions::default());
        assert!(
            matches!(&result, Err(WalError::Corrupt { file, offset, .. })
                if *file == seg && *offset == last as u64),
            "{durability:?}: {:?}",
            result.map(|(_, r, _)| r)
        );
    }
    Ok(())
}

#[test]
fn concurrent_appenders_are_each_acknowledged_proven() -> TestResult {
    let sim = SimStorage::new(10);
    let (wal, _, _) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    let seg = segments(&sim, dir())[0].clone();
    let appended = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (wal, appended, sim, seg) = (&wal, &appended, &sim, &seg);
            s.spawn(move || {
                for i in 0..40u64 {
                    let body = format!("t{t} i{i}").into_bytes();
                    let ticket = wal
                        .append(&[kairos_wal::Record {
                            record_type: 1,
                            body: &body,
                        }])
                        .expect("append");
                    let lsn = ticket.last_lsn();
                    ticket.wait().expect("wait");
                    // Acknowledged: a mark slot covers it now (slots only grow; no roll in a
                    // 1 MiB segment).
                    let bytes = sim.read_durable_file(seg).expect("segment");
                    assert!(
                        slots_mark(&bytes) >= lsn.0,
                        "LSN {lsn:?} acknowledged unproven"
                    );
                    appended.lock().expect("lock").push((lsn.0, body));
                }
            });
        }
    });
    drop(wal);
    sim.power_cut();
    // Before any reopen (which would put what it replays on record itself): a cut into the
    // last frame, acknowledged by the writer's own proof, is refused.
    let bytes = sim.read_file(&seg).ok_or("segment")?;
    let &(last, _) = data_frames(&bytes).last().ok_or("a frame")?;
    sim.write_file(&seg, &bytes[..last + 1]);
    assert!(matches!(
        open(&sim, WalOptions::default()),
        Err(WalError::Corrupt { .. })
    ));
    sim.write_file(&seg, &bytes);
    // Every acknowledged record survives the power cut.
    let mut appended = appended.into_inner()?;
    appended.sort();
    let (_wal, _, replayed) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    assert_eq!(replayed.len(), appended.len());
    for ((lsn, _, body), (want_lsn, want_body)) in replayed.iter().zip(&appended) {
        assert_eq!((lsn, body), (want_lsn, want_body));
    }
    Ok(())
}

#[test]
fn a_failed_proof_sync_poisons_and_acknowledges_nothing() -> TestResult {
    let sim = SimStorage::new(11);
    let (wal, _, _) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    for i in 1..=4 {
        append_one(&wal, i)?;
    }
    // Append 5's data sync succeeds, its proof sync fails.
    sim.inject(FaultPlan {
        after: 1,
        op: FaultOp::Sync,
        kind: FaultKind::Eio,
    });
    let failed = append_one(&wal, 5);
    assert!(matches!(failed, Err(WalError::Io { .. })), "{failed:?}");
    assert!(wal.poisoned().is_some());
    assert!(matches!(
        append_one(&wal, 6),
        Err(WalError::Poisoned { .. })
    ));
    drop(wal);
    sim.clear_faults();
    sim.power_cut();
    let (_wal, _, replayed) = open(&sim, WalOptions::default())?;
    assert_prefix(&replayed, 4, 5);
    Ok(())
}

#[test]
fn appends_to_a_version_1_segment_are_proven_through_synced() -> TestResult {
    // A version-1 segment has no slots: each acknowledgement records it in SYNCED instead.
    let sim = SimStorage::new(12);
    let store_id = [5; 16];
    let seg1 = dir().join(format::segment_file_name(1, kairos_wal::Lsn(1)));
    sim.write_file(&dir().join("META"), &encode_meta(&store_id));
    let records: Vec<(u8, Vec<u8>)> = (1..=3).map(|i| (record_type(i), body(i))).collect();
    sim.write_file(&seg1, &version_1_segment(store_id, &records));
    let (wal, _, replayed) = open(&sim, proven(Durability::Sync, 1 << 20))?;
    assert_eq!(replayed, expected(3));
    // Open put the replayed records on record.
    assert_eq!(
        synced_file(&sim).map(|s| (s.seq, s.synced_lsn.0)),
        Some((1, 3))
    );
    for i in 4..=6 {
        append_one(&wal, i)?;
        assert_eq!(synced_file(&sim).map(|s| s.synced_lsn.0), Some(i));
    }
    drop(wal);
    sim.power_cut();
    let bytes = sim.read_file(&seg1).ok_or("segment")?;
    let (last, lsn) = *data_frames_from(&bytes, format::SEGMENT_HEADER_BYTES)
        .last()
        .ok_or("a frame")?;
    assert_eq!(lsn, 6);
    sim.write_file(&seg1, &bytes[..last + 1]);
    let result = open(&sim, WalOptions::default());
    assert!(
        matches!(&result, Err(WalError::Corrupt { file, .. }) if *file == seg1),
        "{:?}",
        result.map(|(_, r, _)| r)
    );
    Ok(())
}

#[test]
fn a_newest_segment_whose_roll_was_cut_short_is_put_on_record_at_open() -> TestResult {
    // A roll that completed its new segment but crashed before recording it in SYNCED (or a
    // log written without proof): the newest segment holds its header and empty slots, and no
    // mark names it. Reopened with proof, records acknowledged in it must not be lost silently
    // when the segment is later deleted or emptied. (Found by review: open reused the segment
    // without putting it on record.)
    let sim = SimStorage::new(13);
    let unproven = WalOptions {
        proof_before_ack: false,
        ..proven(Durability::Sync, 4096)
    };
    let (wal, _, _) = open(&sim, unproven)?;
    let mut n = 0;
    while segments(&sim, dir()).len() < 2 {
        n += 1;
        append_one(&wal, n)?;
    }
    drop(wal);
    assert!(synced_file(&sim).is_none());
    let newest = segments(&sim, dir()).pop().ok_or("a segment")?;
    let name = newest.file_name().ok_or("a name")?.to_string_lossy();
    let (seq, first) = format::parse_segment_file_name(&name).ok_or("segment name")?;
    // As the roll left it: the header, both slots empty.
    let header = sim.read_file(&newest).ok_or("segment")?;
    let mut rolled = header[..format::SEGMENT_HEADER_BYTES].to_vec();
    rolled.resize(SEGMENT_FRAMES_OFFSET, 0);
    sim.write_file(&newest, &rolled);
    let sealed = first.0 - 1;

    let (wal, report, replayed) = open(&sim, proven(Durability::Sync, 4096))?;
    assert_eq!(replayed, expected(sealed));
    assert!(report.torn_tail.is_none());
    assert_eq!(synced_file(&sim).map(|s| s.seq), Some(seq));
    for i in sealed + 1..=sealed + 3 {
        append_one(&wal, i)?;
    }
    drop(wal);
    sim.power_cut();
    let crashed = snapshot(&sim, dir());
    sim.remove_file(&newest)?;
    assert!(
        matches!(
            open(&sim, WalOptions::default()),
            Err(WalError::MissingSegment { .. })
        ),
        "deleted newest segment"
    );
    sim.write_file(&newest, b"");
    assert!(
        matches!(
            open(&sim, WalOptions::default()),
            Err(WalError::Corrupt { .. })
        ),
        "emptied newest segment"
    );
    for (path, bytes) in &crashed {
        sim.write_file(path, bytes);
    }
    let (_wal, _, replayed) = open(&sim, WalOptions::default())?;
    assert_eq!(replayed, expected(sealed + 3));
    Ok(())
}
