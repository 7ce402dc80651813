//! `kairos checkpoint DIR`: an offline checkpoint of a real directory.
#![cfg(feature = "cli")]

use kairos::{Config, Engine};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const KAIROS: &str = env!("CARGO_BIN_EXE_kairos");

fn config() -> Config {
    let mut c = Config::default();
    // The whole horizon resident: the tasks here due hours or days out stay
    // in the wheel (their payloads, not they, go to overflow files).
    c.resident_window = None;
    c.segment_bytes = kairos_wal::SEGMENT_BYTES_MIN;
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    c
}

fn segments(dir: &Path) -> TestResult<usize> {
    Ok(std::fs::read_dir(dir.join("wal"))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".seg"))
        .count())
}

#[test]
fn checkpoint_offline_then_reopen() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let engine = Engine::open(dir, config())?;
    for i in 0..400 {
        engine.schedule_after(
            format!("k{i}").as_bytes(),
            Duration::from_secs(3600),
            b"payload",
        )?;
    }
    for i in 0..100 {
        assert!(engine.cancel(format!("k{i}").as_bytes())?.is_cancelled());
    }
    engine.shutdown()?;
    let before = segments(dir)?;
    let out = Command::new(KAIROS)
        .args(["checkpoint", "--json"])
        .arg(dir)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["tasks"], 300);
    assert_eq!(v["written"], true);
    // Due in an hour, beyond the one-minute payload window: all moved to disk.
    assert_eq!(v["payloads_moved"], 300);
    let removed = v["segments_removed"].as_u64().ok_or("segments_removed")? as usize;
    assert!(removed > 0);
    assert_eq!(segments(dir)?, before - removed);
    // verify starts from the checkpoint, as the engine's open does.
    let out = Command::new(KAIROS)
        .args(["verify", "--json"])
        .arg(dir)
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(
        (v["ok"].clone(), v["live_tasks"].clone()),
        (Value::from(true), Value::from(300))
    );
    // The offline checkpoint runs with the default configuration: due in
    // an hour, beyond the one-minute resident window, every task is far.
    assert_eq!(
        (
            v["checkpoint"]["tasks"].clone(),
            v["checkpoint"]["far_tasks"].clone()
        ),
        (Value::from(0), Value::from(300))
    );
    // Again: nothing new to write.
    let out = Command::new(KAIROS).arg("checkpoint").arg(dir).output()?;
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("already covers"));
    let engine = Engine::open(dir, config())?;
    assert_eq!(engine.recovery().pending, 300);
    // Open elsewhere: refused.
    let out = Command::new(KAIROS).arg("checkpoint").arg(dir).output()?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("open in another engine"));
    engine.shutdown()?;
    // The payloads moved to an overflow file (due in an hour, beyond the
    // one-minute payload window); damage there is found by verify.
    let ovf: Vec<_> = std::fs::read_dir(dir.join("overflow"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert_eq!(ovf.len(), 1, "{ovf:?}");
    let mut bytes = std::fs::read(&ovf[0])?;
    let at = bytes.len() - 3;
    bytes[at] ^= 1;
    std::fs::write(&ovf[0], &bytes)?;
    let out = Command::new(KAIROS)
        .args(["verify", "--json"])
        .arg(dir)
        .output()?;
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(v["error"]["file"].as_str(), ovf[0].to_str());
    assert!(v["error"]["offset"].as_u64().is_some(), "{v}");
    // Not a data directory, nor one with an empty wal/: refused, and no log is created.
    let empty = tempfile::tempdir()?;
    for command in [&["checkpoint"][..], &["dead-letters", "list"]] {
        let out = Command::new(KAIROS)
            .args(command)
            .arg(empty.path())
            .output()?;
        assert_eq!(out.status.code(), Some(1), "{command:?}");
        std::fs::create_dir_all(empty.path().join("wal"))?;
        let out = Command::new(KAIROS)
            .args(command)
            .arg(empty.path())
            .output()?;
        assert_eq!(out.status.code(), Some(1), "{command:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("holds no log"), "{command:?}: {stderr}");
        assert_eq!(std::fs::read_dir(empty.path().join("wal"))?.count(), 0);
        std::fs::remove_dir(empty.path().join("wal"))?;
    }
    Ok(())
}

/// A data directory whose log was trimmed by a checkpoint that is then deleted: the records
/// before the log's start are gone, and the engine refuses to open it. `verify`, `inspect` and
/// `dump` must all say so (exit 1, naming the missing checkpoint), not report a healthy
/// directory with the trimmed tasks silently missing.
#[test]
fn a_trimmed_log_without_its_checkpoint_fails_verify_inspect_and_dump() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let engine = Engine::open(dir, config())?;
    for i in 0..400 {
        engine.schedule_after(
            format!("old{i}").as_bytes(),
            Duration::from_secs(86_400),
            b"p",
        )?;
    }
    let report = engine.checkpoint()?;
    assert!(report.segments_removed > 0, "{report:?}");
    for i in 0..50 {
        engine.schedule_after(
            format!("new{i}").as_bytes(),
            Duration::from_secs(86_400),
            b"p",
        )?;
    }
    engine.shutdown()?;
    for entry in std::fs::read_dir(dir.join("checkpoint"))? {
        std::fs::remove_file(entry?.path())?;
    }
    assert!(Engine::open(dir, config()).is_err(), "the engine opened");
    // The data directory, or its wal/ given alone (read with its data directory all the same).
    for (command, target) in [
        ("verify", dir.to_path_buf()),
        ("inspect", dir.to_path_buf()),
        ("dump", dir.to_path_buf()),
        ("verify", dir.join("wal")),
        ("inspect", dir.join("wal")),
        ("dump", dir.join("wal")),
    ] {
        let out = Command::new(KAIROS).arg(command).arg(&target).output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(1), "{command}: {text}");
        assert!(
            text.contains("there is no checkpoint, but the log starts at LSN"),
            "{command}: {text}"
        );
    }
    // The same log copied out as a log on its own, named wal/: read by itself unless its
    // parent has both an engine's LOCK file and a checkpoint/ directory (either alone is no
    // data directory) — and read by itself, a trimmed log fails too, saying that it needs the
    // checkpoint of the data directory it came from.
    let case = tempfile::tempdir()?;
    std::fs::create_dir(case.path().join("wal"))?;
    for entry in std::fs::read_dir(dir.join("wal"))? {
        let entry = entry?;
        std::fs::copy(
            entry.path(),
            case.path().join("wal").join(entry.file_name()),
        )?;
    }
    let read_copy = |expected: &str| -> TestResult<()> {
        for command in ["verify", "inspect", "dump"] {
            let out = Command::new(KAIROS)
                .arg(command)
                .arg(case.path().join("wal"))
                .output()?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{command} ({expected}): {stderr}"
            );
            assert!(stderr.contains(expected), "{command}: {stderr}");
        }
        Ok(())
    };
    let alone = "it was trimmed after a checkpoint";
    read_copy(alone)?;
    std::fs::create_dir(case.path().join("checkpoint"))?;
    read_copy(alone)?;
    std::fs::remove_dir(case.path().join("checkpoint"))?;
    std::fs::write(case.path().join("LOCK"), b"")?;
    read_copy(alone)?;
    std::fs::create_dir(case.path().join("checkpoint"))?;
    // A data directory's log, its checkpoint gone.
    read_copy("there is no checkpoint, but the log starts at LSN")?;
    for command in ["verify", "inspect"] {
        let out = Command::new(KAIROS)
            .args([command, "--json"])
            .arg(dir)
            .output()?;
        assert_eq!(out.status.code(), Some(1), "{command}");
        let v: Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(v["ok"], false, "{command}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("there is no checkpoint"), "{command}: {v}");
    }
    Ok(())
}
