//! Every single-byte flip of an overflow file, against the engine: `kairos verify` (its own
//! checking code, run in process on the simulated disk) passes the damaged directory exactly
//! when the engine opens it and then delivers every task still live — far tasks, tasks whose
//! payload is on disk, a dead letter whose payload is on disk — with its exact payload,
//! without being poisoned. A flip in an entry no task needs any more (a task cancelled, or
//! given a new payload, after the checkpoint) must pass both; a flip in one a task needs,
//! or in the header, must fail both.

#![cfg(feature = "cli")]

mod common;

use common::far::{at, due, key};
use common::{drain, SimHarness, Stop, TaskMap, TestResult, START_MS};
use kairos::{Engine, ManualClock};
use kairos_wal::{SimStorage, Storage};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::far::cfg_one_attempt as config;

/// Files and their bytes.
type Image = Vec<(PathBuf, Vec<u8>)>;

/// Every file under `dir` on `sim`, with its bytes.
fn image(sim: &SimStorage, dir: &Path) -> TestResult<Image> {
    let mut out = Vec::new();
    for sub in ["", "wal", "checkpoint", "overflow"] {
        let d = dir.join(sub);
        for name in sim.list(&d)? {
            let path = d.join(name);
            if let Some(bytes) = sim.read_file(&path) {
                out.push((path, bytes));
            }
        }
    }
    Ok(out)
}

/// The directory: far tasks 0..6 (one cancelled after the checkpoint), near tasks whose
/// payloads the checkpoint moved to disk (one cancelled, one given a new payload after it),
/// and a dead letter whose payload is on disk; shut down cleanly. Returns its image, the
/// overflow file's path and what must be delivered (key → due, payload).
fn build() -> TestResult<(Image, PathBuf, TaskMap)> {
    let mut h = SimHarness::new(41, config())?;
    let mut model = TaskMap::new();
    for i in 0..6 {
        let payload = format!("far payload {i}").into_bytes();
        h.engine().schedule(&key(i), at(due(i)), &payload)?;
        model.insert(key(i), (due(i), payload));
    }
    for i in 0..4u64 {
        let (k, due_ms) = (
            format!("near-{i}").into_bytes(),
            START_MS + (10 + i) * 60_000,
        );
        let payload = format!("near payload {i}").into_bytes();
        h.engine().schedule(&k, at(due_ms), &payload)?;
        model.insert(k, (due_ms, payload));
    }
    h.engine()
        .schedule(b"dl", at(START_MS + 5 * 60_000), b"dead payload")?;
    h.engine().checkpoint()?;
    assert!(h.engine().cancel(&key(2))?.is_cancelled());
    model.remove(&key(2));
    assert!(h.engine().cancel(b"near-1")?.is_cancelled());
    model.remove(b"near-1".as_slice());
    h.engine()
        .reschedule(b"near-3", at(START_MS + 20 * 60_000), Some(b"new payload"))?;
    model.insert(
        b"near-3".to_vec(),
        (START_MS + 20 * 60_000, b"new payload".to_vec()),
    );
    let ds = h.advance(Duration::from_secs(5 * 60))?;
    assert_eq!(ds.len(), 1);
    h.engine().consumer().nack(&ds[0], None, "failed")?;
    h.stop(Stop::Clean)?;
    let files = image(&h.sim, &h.dir)?;
    let ovf = h.dir.join("overflow").join(kairos::overflow::file_name(1));
    assert!(files.iter().any(|(p, _)| *p == ovf));
    Ok((files, ovf, model))
}

/// Whether the engine opens the directory on `sim` three hours on and delivers exactly
/// `model`, with the dead letter and its payload, never poisoned; `Err` with what went
/// wrong otherwise.
fn engine_serves(sim: &SimStorage, dir: &Path, model: &TaskMap) -> Result<(), String> {
    let clock = ManualClock::new(START_MS + 3 * 3_600_000);
    let engine = Engine::open_with(
        dir,
        config(),
        Arc::new(sim.clone()),
        Arc::new(clock.clone()),
    )
    .map_err(|e| format!("open: {e}"))?;
    let dead = engine.dead_letters();
    if dead.len() != 1 || &dead[0].payload[..] != b"dead payload" {
        return Err(format!("dead letters: {dead:?}"));
    }
    let mut got = TaskMap::new();
    let ds = drain(&engine).map_err(|e| format!("drain: {e}"))?;
    for d in ds {
        got.insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()));
        engine.consumer().ack(&d).map_err(|e| format!("ack: {e}"))?;
    }
    if got != *model {
        return Err(format!(
            "delivered {} tasks, not the {} expected",
            got.len(),
            model.len()
        ));
    }
    engine.shutdown().map_err(|e| format!("shutdown: {e}"))
}

#[test]
fn verify_passes_a_flipped_overflow_file_exactly_when_the_engine_serves_it() -> TestResult {
    let (files, ovf, model) = build()?;
    let dir = PathBuf::from("/kairos");
    let clean = files
        .iter()
        .find(|(p, _)| *p == ovf)
        .map(|(_, b)| b.clone())
        .ok_or("overflow file")?;
    // The undamaged directory: both pass.
    let write = |ovf_bytes: &[u8]| {
        let sim = SimStorage::new(1);
        for (p, b) in &files {
            sim.write_file(p, if *p == ovf { ovf_bytes } else { b });
        }
        sim
    };
    let sim = write(&clean);
    let v =
        kairos::fuzzing::verify_log(&sim, &dir.join("wal"), kairos_wal::RECORD_BYTES_MAX_DEFAULT);
    assert!(v.ok, "{}", v.json);
    engine_serves(&write(&clean), &dir, &model)?;
    // Every byte (every 3rd at the default test scale), each flip on a fresh copy.
    let step = if common::scale() > 1 { 1 } else { 3 };
    let (mut passed, mut failed) = (0, 0);
    for i in (0..clean.len()).step_by(step) {
        let mut bytes = clean.clone();
        bytes[i] ^= 0x5a;
        let v = kairos::fuzzing::verify_log(
            &write(&bytes),
            &dir.join("wal"),
            kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        );
        let served = engine_serves(&write(&bytes), &dir, &model);
        assert_eq!(
            v.ok,
            served.is_ok(),
            "byte {i}: verify {} but the engine: {served:?}\n{}",
            if v.ok { "passes" } else { "fails" },
            v.json
        );
        if v.ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    // Both kinds occur: flips in dead entries pass, the rest fail.
    eprintln!("passed {passed}, failed {failed}");
    assert!(
        passed > 10 && failed > 10,
        "passed {passed}, failed {failed}"
    );
    Ok(())
}
