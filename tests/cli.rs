//! End-to-end tests of the `kairos` binary: a small demo run with a restart,
//! failing and retried deliveries, dead letters and a crashed consumer must
//! keep every invariant, its data directory must verify, and a flipped byte
//! in a sealed segment must make `verify` fail naming file and offset; with
//! `--horizon`, payloads must go to disk and come back intact; a log written by
//! `ack_and_schedule` verifies.
//!
//! Timing is never asserted (the lateness bound is set out of reach); only
//! correctness is.

#![cfg(feature = "cli")]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const KAIROS: &str = env!("CARGO_BIN_EXE_kairos");

fn kairos(args: &[&str]) -> Output {
    Command::new(KAIROS)
        .args(args)
        .output()
        .expect("the kairos binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A small demo (2 000 tasks, 30 days in 1.3 s, 64 KiB segments) on `dir`,
/// with `extra` arguments.
fn small_demo(dir: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "demo",
        "--dir",
        dir.to_str().unwrap(),
        "--tasks",
        "2000",
        "--time-scale",
        "2000000",
        "--segment-bytes",
        "65536",
        "--batch",
        "100",
        "--seed",
        "42",
        "--max-p99-ms",
        "600000",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = kairos(&args);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {}\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}

fn count(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing in {report}"))
}

/// The log's segment files, oldest first.
fn segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    files
}

/// Flips one byte in the middle of the largest sealed segment (every
/// segment but the last is sealed); returns the file and the byte's offset.
fn corrupt_sealed_segment(data_dir: &Path) -> (PathBuf, u64) {
    let files = segments(data_dir);
    assert!(files.len() >= 3, "expected several segments, got {files:?}");
    let sealed = &files[..files.len() - 1];
    let file = sealed
        .iter()
        .max_by_key(|f| std::fs::metadata(f).unwrap().len())
        .unwrap()
        .clone();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5A;
    std::fs::write(&file, &bytes).unwrap();
    (file, at as u64)
}

#[test]
fn demo_keeps_every_invariant_then_verify_passes_and_catches_a_flipped_byte() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let report = small_demo(&dir, &[]);

    assert_eq!(report["ok"], Value::Bool(true), "{report}");
    assert_eq!(count(&report, "scheduled"), 2000);
    for zero in [
        "lost",
        "duplicates",
        "attempt_gaps",
        "cancelled_then_delivered",
        "early",
        "unacked",
        "pending_at_end",
    ] {
        assert_eq!(count(&report, zero), 0, "{zero} in {report}");
    }
    // Every task finished in exactly one way.
    assert_eq!(
        count(&report, "cancelled")
            + count(&report, "acked")
            + count(&report, "dead_lettered")
            + count(&report, "abandoned"),
        count(&report, "scheduled"),
        "{report}"
    );
    assert_eq!(
        count(&report, "dead_lettered"),
        count(&report, "dead_letters_kept")
    );
    // Every redelivery is explained.
    assert_eq!(
        count(&report, "redelivered"),
        count(&report, "redelivered_after_nack")
            + count(&report, "redelivered_after_lease")
            + count(&report, "redelivered_after_restart"),
        "{report}"
    );
    // 1 % of 2 000 tasks fail their first delivery: some are retried.
    assert!(count(&report, "retried") > 0, "{report}");
    assert!(count(&report, "nacked") >= count(&report, "retried"));
    // The crashed consumer's deliveries come back (here after the restart:
    // the run is shorter than a lease).
    assert!(count(&report, "crashed_holding") > 0, "{report}");
    assert!(
        count(&report, "redelivered_after_lease") + count(&report, "redelivered_after_restart")
            >= count(&report, "crashed_holding"),
        "{report}"
    );
    assert_eq!(
        count(&report, "recovered_pending")
            + count(&report, "recovered_dead_lettered")
            + count(&report, "abandoned_at_shutdown"),
        count(&report, "pending_at_shutdown"),
        "{report}"
    );
    assert_eq!(report["recovered_clean_shutdown"], Value::Bool(true));
    for field in [
        "schedule_per_sec",
        "elapsed_ms",
        "durability",
        "tasks",
        "time_scale",
        "lease_ms",
        "cancel_in_flight",
        "lease_expired",
        "ack_refused",
    ] {
        assert!(!report[field].is_null(), "{field} missing in {report}");
    }
    for field in ["p50", "p99", "max"] {
        assert!(
            report["lateness_ms"][field].is_number(),
            "lateness {field} in {report}"
        );
    }

    let out = kairos(&["verify", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(text(&out.stdout).contains("OK: every record checks"));

    // Pointed at the log directory itself, with JSON output.
    let out = kairos(&["verify", "--json", dir.join("wal").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["live_tasks"], 0, "every task finished: {v}");
    assert_eq!(v["dead_letters"], report["dead_letters_kept"], "{v}");
    assert_eq!(v["clean_shutdown"], Value::Bool(true));

    // The dead letters the demo left, listed offline.
    let out = kairos(&["dead-letters", "list", "--json", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let letters = v["dead_letters"].as_array().unwrap();
    assert_eq!(letters.len() as u64, count(&report, "dead_letters_kept"));
    for letter in letters {
        assert!(letter["key"].as_str().unwrap().starts_with("order:"));
        assert!(letter["attempts"].as_u64().unwrap() >= 1, "{letter}");
    }

    let (file, flipped_at) = corrupt_sealed_segment(&dir);
    let name = file.file_name().unwrap().to_str().unwrap();
    let out = kairos(&["verify", dir.to_str().unwrap()]);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(all.contains(name), "the damaged file is not named: {all}");
    assert!(all.contains("offset"), "no offset: {all}");

    let out = kairos(&["verify", "--json", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["error"]["file"].as_str().unwrap().ends_with(name), "{v}");
    let offset = v["error"]["offset"].as_u64().expect("an offset");
    assert!(
        offset <= flipped_at,
        "offset {offset} is past the flipped byte {flipped_at}"
    );
    // What was read before the damage: every segment before the damaged one, sealed, and the
    // damaged one if a record of it was read, its end unknown; the records add up; how the log
    // ended is unknown.
    let read = v["segments"].as_array().expect("segments");
    let files = segments(&dir);
    let damaged = files.iter().position(|f| *f == file).unwrap();
    assert!(read.len() == damaged || read.len() == damaged + 1, "{v}");
    for (i, s) in read.iter().enumerate() {
        assert!(s["file"]
            .as_str()
            .unwrap()
            .ends_with(files[i].file_name().unwrap().to_str().unwrap()));
        let sealed = if i < damaged {
            Value::Bool(true)
        } else {
            Value::Null
        };
        assert_eq!(s["sealed"], sealed, "{s}");
        assert_eq!(
            s["bytes"],
            std::fs::metadata(&files[i]).unwrap().len(),
            "{s}"
        );
        assert!(s["first_lsn"].as_u64() <= s["last_lsn"].as_u64(), "{s}");
    }
    let records: u64 = read.iter().map(|s| s["records"].as_u64().unwrap()).sum();
    assert_eq!(records, count(&v, "records"));
    assert_eq!(read[read.len() - 1]["last_lsn"], v["last_lsn"]);
    assert_eq!(v["clean_shutdown"], Value::Null, "{v}");
    let listed = read.len();
    let sealed: Vec<Value> = read.iter().map(|s| s["sealed"].clone()).collect();
    let out = kairos(&["inspect", "--json", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let inspected = v["segments"].as_array().expect("segments");
    assert_eq!(inspected.len(), listed, "{v}");
    for (s, sealed) in inspected.iter().zip(&sealed) {
        assert_eq!(&s["sealed"], sealed, "{s}");
    }
    assert_eq!(v["clean_shutdown"], Value::Null, "{v}");
    assert_eq!(v["durable_lsn"], Value::Null, "{v}");
}

#[test]
fn demo_with_a_horizon_reads_payloads_back_from_overflow_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    // 200 ms of real time is 4.6 simulated days at this scale: the payloads
    // of the long timeouts (7 to 30 days, 0.3 to 1.3 s) move to disk.
    let report = small_demo(&dir, &["--horizon", "200ms"]);

    assert_eq!(report["ok"], Value::Bool(true), "{report}");
    assert_eq!(count(&report, "scheduled"), 2000);
    for zero in [
        "lost",
        "duplicates",
        "attempt_gaps",
        "cancelled_then_delivered",
        "early",
        "unacked",
        "payload_mismatches",
        "foreign_keys",
        "pending_at_end",
    ] {
        assert_eq!(count(&report, zero), 0, "{zero} in {report}");
    }
    assert_eq!(count(&report, "horizon_ms"), 200);
    assert_eq!(count(&report, "payload_window_ms"), 200);
    assert!(count(&report, "checkpoints") > 0, "{report}");
    assert!(count(&report, "payloads_moved") > 0, "{report}");
    assert!(count(&report, "payloads_on_disk_max") > 0, "{report}");
    assert!(count(&report, "overflow_promoted") > 0, "{report}");

    let out = kairos(&["verify", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // The checkpoints let the log's first segments go: its `wal/` given by itself is read
    // with the checkpoint beside it, not as a log whose records refer to unknown tasks.
    assert!(segments(&dir)
        .iter()
        .all(|s| !s.ends_with("0000000000000001-0000000000000001.seg")));
    let wal = dir.join("wal");
    let link = tmp.path().join("log-link");
    std::os::unix::fs::symlink(&wal, &link).unwrap();
    for command in ["verify", "inspect", "dump"] {
        let out = kairos(&[command, wal.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains("reading them together"),
            "{command}: {stderr}"
        );
        // The same log named as `.` from inside it, and through a symbolic link.
        let out = Command::new(KAIROS)
            .args([command, "."])
            .current_dir(&wal)
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{command} .: {stderr}");
        let out = kairos(&[command, link.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{command} via a link: {stderr}");
        assert!(
            stderr.contains("reading them together"),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn verify_refuses_a_directory_without_a_log() {
    let tmp = tempfile::tempdir().unwrap();
    let out = kairos(&["verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let out = kairos(&["verify", tmp.path().join("missing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let dir = tmp.path().to_str().unwrap();
    let refused_with = |reason: &str| {
        let out = kairos(&["verify", dir]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(reason), "{stderr}");
    };
    refused_with("not a Kairos data or log directory");
    // A data directory that lost its log is told apart from a stray directory.
    std::fs::create_dir(tmp.path().join("checkpoint")).unwrap();
    refused_with("which has checkpoint/ but no wal/ directory");
    std::fs::write(tmp.path().join("wal"), b"").unwrap();
    refused_with("wal is not a directory");
}

/// A log whose creation was cut short before segment 1 existed (a crash in the first open:
/// `wal/META` alone, or with segment 1's `.seg.tmp`, or `META.tmp` alone) is a crash state
/// `open` completes (`wal/FORMAT.md`, Recovery step 3): `verify`, `inspect` and `dump` take it
/// as an empty log, as `open` does. (They said "not a Kairos data or log directory".)
#[test]
fn tools_take_a_log_whose_creation_was_cut_short_as_open_does() {
    let tmp = tempfile::tempdir().unwrap();
    let donor = tmp.path().join("donor");
    kairos::Engine::open(&donor, kairos::Config::default())
        .unwrap()
        .shutdown()
        .unwrap();
    let meta = std::fs::read(donor.join("wal/META")).unwrap();
    // Files in `wal/`; "../LOCK" is the data directory's lock file. The last two: a kill
    // during the first open after `wal/` was made, before or after its lock file.
    let cases: [&[(&str, &[u8])]; 5] = [
        &[("META", &meta)],
        &[
            ("META", &meta),
            ("0000000000000001-0000000000000001.seg.tmp", &[0u8; 128]),
        ],
        &[("META.tmp", &meta)],
        &[("../LOCK", &[])],
        &[("../LOCK", &[]), ("LOCK", &[])],
    ];
    for (i, files) in cases.iter().enumerate() {
        let dir = tmp.path().join(format!("cut{i}"));
        std::fs::create_dir_all(dir.join("wal")).unwrap();
        for (name, bytes) in *files {
            std::fs::write(dir.join("wal").join(name), bytes).unwrap();
        }
        let d = dir.to_str().unwrap();
        for args in [&["verify", d][..], &["inspect", d], &["dump", d]] {
            let out = kairos(args);
            assert_eq!(
                out.status.code(),
                Some(0),
                "{args:?} on {files:?}: {}{}",
                text(&out.stdout),
                text(&out.stderr)
            );
        }
        let engine = kairos::Engine::open(&dir, kairos::Config::default()).unwrap();
        assert_eq!(engine.recovery().pending, 0);
        engine.shutdown().unwrap();
        let out = kairos(&["verify", d]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    }
}

/// An empty `wal/` without its data directory's `LOCK` beside it is not taken for a log cut
/// short, nor is another empty directory beside a `LOCK` (an empty `overflow/`, a stray one).
#[test]
fn an_empty_directory_is_no_log_unless_a_data_directory_locked_it() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("bare/wal")).unwrap();
    std::fs::create_dir_all(tmp.path().join("locked/overflow")).unwrap();
    std::fs::write(tmp.path().join("locked/LOCK"), b"").unwrap();
    for dir in ["bare", "locked/overflow"] {
        let out = kairos(&["verify", tmp.path().join(dir).to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{dir}: {}", text(&out.stdout));
        assert!(
            text(&out.stdout).contains("not a Kairos data or log directory"),
            "{dir}: {}",
            text(&out.stdout)
        );
    }
}

/// `inspect` on a directory that is no Kairos directory (`/`, say) fails without walking its
/// whole tree: only its own files are counted.
#[test]
fn inspect_of_a_stray_directory_does_not_walk_its_tree() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("sub").join("deeper")).unwrap();
    std::fs::write(tmp.path().join("sub/deeper/buried.txt"), b"x").unwrap();
    std::fs::write(tmp.path().join("top.txt"), b"y").unwrap();
    let out = kairos(&["inspect", tmp.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("top.txt"), "{stdout}");
    assert!(!stdout.contains("buried.txt"), "{stdout}");
    assert!(
        text(&out.stderr).contains("not a Kairos data or log directory"),
        "{}",
        text(&out.stderr)
    );
}

/// A FIFO where a log file belongs (`wal/META`): every command that reads the directory fails
/// at once naming it, instead of blocking until someone writes to the FIFO; the error says so
/// once, not once per layer.
#[test]
fn a_fifo_in_place_of_a_log_file_is_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let meta = dir.join("wal").join("META");
    std::fs::remove_file(&meta).unwrap();
    let made = Command::new("mkfifo").arg(&meta).status().unwrap();
    assert!(made.success());
    let dir = dir.to_str().unwrap();
    for args in [
        &["verify", dir][..],
        &["inspect", dir],
        &["dump", dir],
        &["checkpoint", dir],
        &["dead-letters", "list", dir],
    ] {
        // A hang fails the test by its own timeout rather than CI's.
        let mut child = Command::new(KAIROS)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                panic!("{args:?} hung on a FIFO");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{args:?}: {all}");
        assert!(all.contains("is not a regular file"), "{args:?}: {all}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.matches("is not a regular file").count() <= 1,
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn demo_refuses_to_remove_a_directory_that_is_not_a_data_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let precious = tmp.path().join("precious.txt");
    std::fs::write(&precious, b"keep me").unwrap();
    let out = kairos(&[
        "demo",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--tasks",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("refusing to remove"));
    assert!(precious.exists());
}

#[test]
fn demo_refuses_to_remove_a_data_directory_holding_files_of_someone_elses() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let dir_arg = dir.to_str().unwrap();
    // Beside the log, and inside it: neither directory is removed.
    for precious in [
        dir.join("notes.txt"),
        dir.join("wal").join("mine.txt"),
        dir.join("wal").join("backup.seg"),
    ] {
        std::fs::write(&precious, b"keep me").unwrap();
        let out = kairos(&["demo", "--dir", dir_arg, "--tasks", "10"]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("refusing to remove"));
        assert!(precious.exists());
        assert!(!segments(&dir).is_empty(), "the log is still there");
        std::fs::remove_file(&precious).unwrap();
    }
    // Only the engine's own files, leftovers of a crash included: removed, and the demo
    // runs afresh.
    std::fs::create_dir_all(dir.join("checkpoint")).unwrap();
    std::fs::create_dir_all(dir.join("overflow")).unwrap();
    for leftover in [
        "checkpoint/next.ckpt.tmp",
        "overflow/00000000000000ff.ovf.tmp",
        "wal/SYNCED.tmp",
    ] {
        std::fs::write(dir.join(leftover), b"").unwrap();
    }
    let report = small_demo(&dir, &[]);
    assert_eq!(report["ok"], Value::Bool(true), "{report}");
    assert_eq!(count(&report, "scheduled"), 2000);
}

/// `--dir .` from inside a data directory: the run replaces its contents (removing the
/// directory itself would fail halfway, after deleting everything, or leave the shell in a
/// deleted directory).
#[test]
fn demo_in_the_current_directory_replaces_its_contents() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let out = Command::new(KAIROS)
        .current_dir(&dir)
        .args([
            "demo",
            "--dir",
            ".",
            "--tasks",
            "500",
            "--time-scale",
            "2000000",
            "--max-p99-ms",
            "600000",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], Value::Bool(true), "{report}");
    assert_eq!(count(&report, "scheduled"), 500);
    assert!(!segments(&dir).is_empty(), "the new run's log is in place");
}

#[test]
fn demo_with_a_bad_segment_size_leaves_the_last_run_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let before = segments(&dir);
    let out = kairos(&[
        "demo",
        "--dir",
        dir.to_str().unwrap(),
        "--segment-bytes",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--segment-bytes"));
    assert_eq!(segments(&dir), before);
}

#[test]
fn demo_bad_arguments_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let dir = dir.to_str().unwrap();
    for bad in [
        &["--time-scale", "0"][..],
        &["--time-scale", "1e308"],
        &["--time-scale", "NaN"],
        &["--segment-bytes", "4095"],
        &["--tasks", "0"],
        &["--durability", "eventually"],
        &["--horizon", "30d"],
        &["--rate", "1e-300"],
        &["--rate", "-1"],
        &["--rate", "inf"],
        &["--max-p99-ms", "NaN"],
        &["--max-p99-ms", "-1"],
        &["--downtime-ms", "18446744073709551615"],
        &["--retry-ms", "315360000001"],
        // Used only by --durability interval: given without it, it would be ignored.
        &["--interval-ms", "50"],
        &["--interval-ms", "50", "--durability", "buffered"],
        &["--interval-ms", "0", "--durability", "interval"],
    ] {
        let mut args = vec!["demo", "--dir", dir];
        args.extend_from_slice(bad);
        let out = kairos(&args);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
    assert!(!tmp.path().join("data").exists(), "nothing was created");
    // Samples written inside the directory the next run removes: refused up front.
    let samples = tmp.path().join("data").join("samples.csv");
    let out = kairos(&[
        "demo",
        "--dir",
        dir,
        "--samples-csv",
        samples.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("inside --dir"),
        "{}",
        text(&out.stderr)
    );
    assert!(!tmp.path().join("data").exists(), "nothing was created");
}

/// Runs `kairos ARGS` with stdout a pipe whose reader is already gone, so
/// that every write fails (EPIPE).
fn kairos_into_a_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    Command::new(KAIROS)
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the kairos binary runs")
}

#[test]
fn commands_into_a_closed_pipe_end_without_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &["--horizon", "200ms"]);
    let dir = dir.to_str().unwrap();
    for (args, code) in [
        (&["verify", dir][..], 0),
        (&["verify", "--json", dir], 0),
        (&["inspect", dir], 0),
        (&["dump", dir], 0),
        (&["dead-letters", "list", dir], 0),
        (&["checkpoint", dir], 0),
    ] {
        let out = kairos_into_a_closed_pipe(args);
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    }
    // The verdict still sets the exit status: a directory with no log fails.
    let out = kairos_into_a_closed_pipe(&["verify", tmp.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
}

/// Errors go to stderr; with stderr (and stdout) a closed pipe — `kairos verify DIR 2>&1 | head
/// -1` once `head` has gone — a failing command still exits 1, not 101 with a panic.
#[test]
fn errors_into_a_closed_stderr_keep_the_exit_status() {
    let tmp = tempfile::tempdir().unwrap();
    let empty = tmp.path().to_str().unwrap();
    let missing = tmp.path().join("missing");
    let missing = missing.to_str().unwrap();
    for args in [
        &["verify", missing][..],
        &["verify", empty],
        &["inspect", empty],
        &["dump", empty],
        &["checkpoint", missing],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let status = Command::new(KAIROS)
            .args(args)
            .stdout(writer.try_clone().expect("a second writer"))
            .stderr(writer)
            .status()
            .expect("the kairos binary runs");
        assert_eq!(status.code(), Some(1), "{args:?}");
    }
}

#[test]
fn demo_into_a_closed_pipe_ends_without_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    for format in [None, Some("--json")] {
        let mut args = vec![
            "demo",
            "--dir",
            dir.to_str().unwrap(),
            "--tasks",
            "1000",
            "--time-scale",
            "2000000",
            "--max-p99-ms",
            "600000",
        ];
        args.extend(format);
        let out = kairos_into_a_closed_pipe(&args);
        let stderr = text(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(out.status.code(), Some(0), "{stderr}");
    }
}

#[test]
fn demo_refuses_to_remove_a_directory_open_in_an_engine() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let engine = kairos::Engine::open(&dir, kairos::Config::default()).unwrap();
    engine
        .schedule_after(b"still-here", std::time::Duration::from_secs(60), b"")
        .unwrap();
    let out = kairos(&["demo", "--dir", dir.to_str().unwrap(), "--tasks", "10"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("open in another engine"));
    assert_eq!(engine.stats().scheduled, 1);
    engine.shutdown().unwrap();
    let reopened = kairos::Engine::open(&dir, kairos::Config::default()).unwrap();
    assert_eq!(reopened.recovery().pending, 1);
}

/// An application's data directory — the engine's files and nothing else, but no `DEMO` file —
/// is refused, not emptied.
#[test]
fn demo_refuses_to_remove_a_data_directory_it_did_not_make() {
    let tmp = tempfile::tempdir().unwrap();
    let engine = kairos::Engine::open(tmp.path(), kairos::Config::default()).unwrap();
    engine
        .schedule_after(b"precious", std::time::Duration::from_secs(3600), b"")
        .unwrap();
    engine.shutdown().unwrap();
    let out = kairos(&[
        "demo",
        "--dir",
        tmp.path().to_str().unwrap(),
        "--tasks",
        "10",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refusing to remove") && stderr.contains("did not make"),
        "{stderr}"
    );
    assert!(
        !text(&out.stdout).contains("removed"),
        "{}",
        text(&out.stdout)
    );
    assert!(!tmp.path().join("DEMO").exists());
    let reopened = kairos::Engine::open(tmp.path(), kairos::Config::default()).unwrap();
    assert_eq!(reopened.recovery().pending, 1);
}

/// A directory a demo made and an application then used (records logged after the demo
/// finished, whose last LSN the demo's `DEMO` file records) is refused too, not emptied; one
/// nothing logged in since is emptied by the next run, as before — also after the commands
/// the demo's report suggests, which open an engine but log nothing.
#[test]
fn demo_refuses_a_directory_used_since_it_finished() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let d = dir.to_str().unwrap();
    for args in [&["dead-letters", "list", d][..], &["checkpoint", d]] {
        let out = kairos(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    small_demo(&dir, &[]);
    let marker = std::fs::read_to_string(dir.join("DEMO")).unwrap();
    assert!(
        marker.contains("last LSN when the demo finished: "),
        "{marker}"
    );
    let engine = kairos::Engine::open(&dir, kairos::Config::default()).unwrap();
    engine
        .schedule_after(b"adopted", std::time::Duration::from_secs(3600), b"")
        .unwrap();
    engine.shutdown().unwrap();
    let out = kairos(&["demo", "--dir", dir.to_str().unwrap(), "--tasks", "10"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refusing to remove") && stderr.contains("logged since"),
        "{stderr}"
    );
    let reopened = kairos::Engine::open(&dir, kairos::Config::default()).unwrap();
    assert!(reopened.recovery().pending >= 1);
    let _ = reopened.cancel(b"adopted").unwrap();
}

/// A demo killed while it runs (as Ctrl-C or `kill` stops it: no report, its log not closed,
/// its `DEMO` file without a last LSN) leaves a directory the next run empties, saying that
/// it was a run that did not finish.
#[test]
fn demo_after_a_killed_demo_empties_its_directory_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let d = dir.to_str().unwrap();
    // 30 simulated days in about 30 s: long enough to be killed while it runs.
    let mut child = Command::new(KAIROS)
        .args(["demo", "--dir", d, "--tasks", "20000", "--json"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait (at most a minute) until its engine has logged something, then kill it.
    let logged = || {
        std::fs::read_dir(dir.join("wal")).is_ok_and(|files| {
            files.flatten().any(|f| {
                f.path().extension().is_some_and(|x| x == "seg")
                    && f.metadata().is_ok_and(|m| m.len() >= 4096)
            })
        })
    };
    let started = std::time::Instant::now();
    while !logged() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the demo logged nothing"
        );
        assert!(child.try_wait().unwrap().is_none(), "the demo ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    assert!(!child.wait().unwrap().success());
    let marker = std::fs::read_to_string(dir.join("DEMO")).unwrap();
    assert!(!marker.contains("last LSN"), "{marker}");

    let again = || {
        kairos(&[
            "demo",
            "--dir",
            d,
            "--tasks",
            "200",
            "--time-scale",
            "2000000",
            "--max-p99-ms",
            "600000",
        ])
    };
    let out = again();
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_eq!(
        stdout.lines().next(),
        Some(
            format!("removed the previous data directory {d} (left by a demo that did not finish)")
                .as_str()
        ),
        "{stdout}"
    );
    let marker = std::fs::read_to_string(dir.join("DEMO")).unwrap();
    assert!(
        marker.contains("last LSN when the demo finished: "),
        "{marker}"
    );
    // A finished run's directory is emptied without the note.
    let out = again();
    assert_eq!(
        text(&out.stdout).lines().next(),
        Some(format!("removed the previous data directory {d}").as_str())
    );
}

/// The demo's `DEMO` file is at the top of its directory, and the engine and every tool take
/// the directory as they did without it.
#[test]
fn demo_marks_its_directory_and_the_tools_ignore_the_mark() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &["--horizon", "200ms"]);
    assert!(dir.join("DEMO").is_file());
    let d = dir.to_str().unwrap();
    for args in [
        &["verify", d][..],
        &["inspect", d],
        &["dump", d],
        &["dead-letters", "list", d],
        &["checkpoint", d],
        &["verify", d],
    ] {
        let out = kairos(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    drop(kairos::Engine::open(&dir, kairos::Config::default()).unwrap());
    assert!(dir.join("DEMO").is_file(), "the engine leaves it alone");
}

/// An argument that fails only when used (a samples file that cannot be created) fails before
/// the last run's directory is removed.
#[test]
fn demo_checks_its_samples_file_before_removing_the_last_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &[]);
    let before = segments(&dir);
    let samples = tmp.path().join("missing").join("samples.csv");
    let out = kairos(&[
        "demo",
        "--dir",
        dir.to_str().unwrap(),
        "--samples-csv",
        samples.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot create"), "{stderr}");
    assert!(!text(&out.stdout).contains("removed"));
    assert_eq!(segments(&dir), before, "the last run is still there");
}

/// `verify`, `inspect` and `dump` read a directory an engine has open (its files may change
/// under them) with a warning saying so, and without it once the engine is shut down.
#[cfg(target_os = "linux")]
#[test]
fn readers_warn_when_an_engine_has_the_directory_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    let engine = kairos::Engine::open(tmp.path(), kairos::Config::default()).unwrap();
    engine
        .schedule_after(b"open", std::time::Duration::from_secs(60), b"")
        .unwrap();
    let warned = |expected: bool| {
        for command in ["verify", "inspect", "dump"] {
            let out = kairos(&[command, dir]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(0), "{command}: {stderr}");
            assert_eq!(
                stderr.contains("is open in a running engine (its LOCK is held)"),
                expected,
                "{command}: {stderr}"
            );
        }
    };
    warned(true);
    engine.shutdown().unwrap();
    warned(false);
}

#[test]
fn help_and_version() {
    let out = kairos(&["--version"]);
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("kairos "));
    for args in [&["--help"][..], &["demo", "--help"], &["verify", "--help"]] {
        let out = kairos(args);
        assert!(out.status.success(), "{args:?}");
        assert!(!out.stdout.is_empty());
    }
    assert_eq!(kairos(&["demo", "--tasks", "0"]).status.code(), Some(2));
    // Refused before anything runs (a run would use this directory).
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    for bad in ["0", "0s", "2", "1.5s"] {
        let args = ["demo", "--dir", dir.to_str().unwrap(), "--horizon", bad];
        let out = kairos(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--horizon {bad}");
        // One advice for every refusal, never suggesting the 0 it refuses.
        assert!(stderr.contains("more than 0 (e.g. 2s, 500ms)"), "{stderr}");
        assert!(!stderr.contains("use 0"), "{stderr}");
    }
    assert!(!dir.exists());
    let out = kairos(&["demo", "--help"]);
    assert!(text(&out.stdout).contains("1 to 50 000 000"));
}

/// `--record-bytes-max` below the smallest SCHEDULE body (23 bytes) would make every record of
/// a log damage: a usage error, as is one above what a log frame holds.
#[test]
fn record_bytes_max_below_the_smallest_record_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap();
    for command in ["verify", "dump", "inspect"] {
        for bad in ["0", "10", "22", "1073741820", "-1", "lots"] {
            let out = kairos(&[command, "--record-bytes-max", bad, dir]);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {bad}: {stderr}");
        }
        // Accepted (and the empty directory, which holds no log, fails as such).
        for good in ["23", "1073741819"] {
            let out = kairos(&[command, "--record-bytes-max", good, dir]);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{command} {good}: {}",
                text(&out.stderr)
            );
        }
    }
}

/// A trimmed log copied away from its data directory (`cp -a DIR/wal /tmp/w`): `verify`,
/// `inspect` and `dump` each say that it was trimmed and needs its checkpoint, and exit 1 —
/// as they do for the data directory without its checkpoint.
#[test]
fn a_trimmed_log_read_alone_is_reported_as_missing_its_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    small_demo(&dir, &["--horizon", "200ms"]);
    let first = segments(&dir)[0].clone();
    let name = first.file_name().unwrap().to_str().unwrap().to_owned();
    assert!(
        !name.starts_with("0000000000000001-"),
        "the demo's checkpoints trimmed the log: {name}"
    );
    let alone = tmp.path().join("w");
    std::fs::create_dir(&alone).unwrap();
    for entry in std::fs::read_dir(dir.join("wal")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), alone.join(entry.file_name())).unwrap();
    }
    for command in ["verify", "inspect", "dump"] {
        let out = kairos(&[command, alone.to_str().unwrap()]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(1), "{command}: {stderr}");
        assert!(
            stderr.contains("it was trimmed after a checkpoint")
                && stderr.contains("read the data directory it came from"),
            "{command}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        if command != "dump" {
            assert!(
                stdout.contains("FAILED: the log starts at LSN"),
                "{command}: {stdout}"
            );
        }
    }
    // Beside its data directory's checkpoint it reads whole.
    let out = kairos(&["verify", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// The summary's header gives the simulated month in a unit that shows it: `--time-scale 1e8`
/// makes 30 days last 26 ms (it printed "0.0 s").
#[test]
fn demo_header_shows_a_short_span_in_milliseconds() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let out = kairos(&[
        "demo",
        "--dir",
        dir.to_str().unwrap(),
        "--tasks",
        "50",
        "--time-scale",
        "1e8",
        "--max-p99-ms",
        "600000",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("(30 days -> 25.9 ms)"), "{stdout}");
}

/// `--dir` given as a symbolic link to a directory is followed: the demo runs in the directory
/// (it was refused as "exists and is not a directory"), and the next run empties it again,
/// leaving the link.
#[cfg(unix)]
#[test]
fn demo_follows_a_dir_given_as_a_symbolic_link() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    for _ in 0..2 {
        let report = small_demo(&link, &[]);
        assert_eq!(report["ok"], Value::Bool(true), "{report}");
        assert!(real.join("DEMO").is_file());
        assert!(!segments(&real).is_empty());
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    }
    // A samples file inside the directory by its real path is inside --dir all the same.
    let out = kairos(&[
        "demo",
        "--dir",
        link.to_str().unwrap(),
        "--samples-csv",
        real.join("samples.csv").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("inside --dir"));
    // So is one named by a dangling link into it (no path resolves before the file exists;
    // the samples were written into the directory, then removed with the last run, exit 0).
    let dangling = tmp.path().join("samples-link.csv");
    std::os::unix::fs::symlink(real.join("new-samples.csv"), &dangling).unwrap();
    let before = segments(&real);
    let out = kairos(&[
        "demo",
        "--dir",
        real.to_str().unwrap(),
        "--samples-csv",
        dangling.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("inside --dir"));
    assert_eq!(segments(&real), before, "the last run is still there");
    assert!(!real.join("new-samples.csv").exists());
}

/// A log written by `ack_and_schedule` (a frame holding a delivery's ACK and the SCHEDULE of
/// the next task under the same key) verifies, after a clean shutdown and after a crash, and
/// `verify` counts the one live task: the key passes from task to task, never held twice.
#[test]
fn verify_accepts_the_frames_of_ack_and_schedule() {
    use kairos::{AckScheduleOutcome, Config, Due, Engine, ManualClock};
    use std::sync::Arc;
    use std::time::Duration;
    for crash in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let mut config = Config::default();
        config.segment_bytes = 4096;
        let engine = Engine::open_with(
            dir.path(),
            config,
            Arc::new(kairos::kairos_wal::FsStorage),
            Arc::new(clock.clone()),
        )
        .unwrap();
        let consumer = engine.consumer();
        let minute = Duration::from_secs(60);
        engine
            .schedule_after(b"report:every-minute", minute, &[7; 300])
            .unwrap();
        for _ in 0..40 {
            clock.advance(minute);
            engine.run_until_idle();
            let run = consumer.try_recv().unwrap();
            let next = consumer
                .ack_and_schedule(&run, Due::After(minute), run.payload())
                .unwrap();
            assert!(matches!(next, AckScheduleOutcome::Scheduled(_)));
        }
        if crash {
            drop(engine);
        } else {
            engine.shutdown().unwrap();
        }
        let out = kairos(&["verify", "--json", dir.path().to_str().unwrap()]);
        assert!(
            out.status.success(),
            "crash {crash}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["live_tasks"], 1, "crash {crash}: {v}");
        assert_eq!(v["clean_shutdown"], Value::Bool(!crash), "{v}");
    }
}

/// A negative number given to an option that takes a number is refused by that option's own
/// check, naming it and its range — not taken for an unknown flag (clap's default: "unexpected
/// argument '-5' found", the option unnamed), which is what a new user saw for `--tasks -5`.
#[test]
fn a_negative_number_is_refused_naming_its_option() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let dir = dir.to_str().unwrap();
    for (args, says) in [
        (
            &["demo", "--dir", dir, "--tasks", "-5"][..],
            "invalid value '-5' for '--tasks <N>'",
        ),
        (
            &["demo", "--dir", dir, "--time-scale", "-1"],
            "invalid value '-1' for '--time-scale <X>': must be a number from 1",
        ),
        (
            &["demo", "--dir", dir, "--rate", "-0.5"],
            "invalid value '-0.5' for '--rate <N>'",
        ),
        (
            &["bench", "--dir", dir, "--tasks", "-5"],
            "invalid value '-5' for '--tasks <N>'",
        ),
        (
            &[
                "bench",
                "--dir",
                dir,
                "--tasks",
                "10",
                "--far-fraction",
                "-0.1",
            ],
            "invalid value '-0.1' for '--far-fraction <F>'",
        ),
        (
            &["dead-letters", "purge", dir, "--id", "-3"],
            "invalid value '-3' for '--id <ID>'",
        ),
    ] {
        assert_refused_naming_the_option(args, says);
    }
    // A flag still is one: a value that is not a number is not swallowed.
    let out = kairos(&["demo", "--dir", dir, "--tasks", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(!tmp.path().join("data").exists(), "nothing was created");
}

/// `kairos args` exits 2 with an error that `says` (the option and its value), not clap's
/// "unexpected argument" (a negative value taken for a flag).
fn assert_refused_naming_the_option(args: &[&str], says: &str) {
    let out = kairos(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(says), "{args:?}: {stderr}");
    assert!(
        !stderr.contains("unexpected argument"),
        "{args:?}: {stderr}"
    );
}

/// A negative duration given to an option that takes one (`--delay -5s`) is refused by that
/// option's own check, naming it — as a negative number is (above). Clap took `-5s` for flags
/// (`unexpected argument '-5' found`, with the tip to pass '-- -5', which for an option's value
/// does not work), leaving the option unnamed: only values that read as numbers were let
/// through to the option.
#[test]
fn a_negative_duration_is_refused_naming_its_option() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let dir = dir.to_str().unwrap();
    for (args, says) in [
        (
            &["dead-letters", "requeue", dir, "--all", "--delay", "-5s"][..],
            "invalid value '-5s' for '--delay <DURATION>'",
        ),
        (
            &["demo", "--dir", dir, "--horizon", "-1d"],
            "invalid value '-1d' for '--horizon <DURATION>'",
        ),
        (
            &[
                "bench",
                "--dir",
                dir,
                "--tasks",
                "10",
                "--resident-window",
                "-1m",
            ],
            "invalid value '-1m' for '--resident-window <D|off>'",
        ),
    ] {
        assert_refused_naming_the_option(args, says);
    }
    // A flag after such an option is taken for its value, and refused by the same check.
    let out = kairos(&["demo", "--dir", dir, "--horizon", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(!tmp.path().join("data").exists(), "nothing was created");
}
