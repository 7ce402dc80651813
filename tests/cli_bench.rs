//! End-to-end tests of `kairos bench`: a small run reports every field with a
//! sane value and recovers exactly the tasks it did not cancel; a non-empty
//! `--dir` is refused; bad arguments are usage errors.
//!
//! Timings are never asserted, only that they were measured.

#![cfg(feature = "cli")]

use serde_json::Value;
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

/// `kairos bench --tasks 2000 --durability buffered --json` plus `extra`, on
/// a fresh `--dir`; returns the report and checks the fields every run has.
fn small_bench(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut args = vec![
        "bench",
        "--dir",
        data.to_str().unwrap(),
        "--tasks",
        "2000",
        "--durability",
        "buffered",
        "--batch",
        "300",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = kairos(&args);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    let r: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    let u = |field: &str| {
        r[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} missing or not a count in {r}"))
    };
    let f = |field: &str| {
        r[field]
            .as_f64()
            .unwrap_or_else(|| panic!("{field} missing or not a number in {r}"))
    };
    assert_eq!(u("tasks"), 2000);
    assert_eq!(r["durability"], "buffered");
    assert_eq!(u("key_bytes"), 24);
    assert_eq!(u("cancelled"), 1000);
    assert_eq!(u("recovered_pending"), 1000);
    assert_eq!(u("expected_pending"), 1000);
    assert_eq!(r["ok"], true);
    assert_eq!(u("wheel_tasks") + u("overflow_tasks"), 2000);
    assert!(u("cores") >= 1);
    assert!(f("schedule_per_sec") > 0.0, "{r}");
    assert!(f("cancel_per_sec") > 0.0, "{r}");
    for field in ["schedule_ms", "cancel_ms", "close_ms", "recovery_ms"] {
        assert!(f(field) >= 0.0, "{field} in {r}");
    }
    assert!(u("disk_bytes") > 0, "{r}");
    assert!(f("checkpoint_ms") >= 0.0, "{r}");
    if cfg!(target_os = "linux") {
        // The peak RSS of a process that held 2 000 tasks and an engine.
        assert!(u("rss_bytes") > 1024 * 1024, "{r}");
    }
    for field in ["ram_bytes_per_wheel_task", "ram_bytes_per_overflow_task"] {
        assert!(r.get(field).is_some(), "{field} missing in {r}");
    }
    assert!(data.is_dir(), "a given --dir is kept");
    r
}

#[test]
fn small_run_with_the_delay_mix_reports_every_field() {
    let r = small_bench(&[]);
    assert!(r["far_fraction"].is_null(), "{r}");
    // The mix's 20 % tail reaches 30 days: some of it is beyond 18 days.
    assert!(r["overflow_tasks"].as_u64().unwrap() > 0, "{r}");
    assert!(r["wheel_tasks"].as_u64().unwrap() > 1000, "{r}");
    assert_eq!(r["payload_bytes"], 0);
}

#[test]
fn small_run_with_far_tasks_and_payloads_reports_every_field() {
    let r = small_bench(&["--far-fraction", "0.8", "--payload-bytes", "200"]);
    assert_eq!(r["far_fraction"].as_f64(), Some(0.8));
    assert_eq!(r["payload_bytes"], 200);
    let overflow = r["overflow_tasks"].as_u64().unwrap();
    assert!((1400..=1800).contains(&overflow), "{r}");
    // Every task is due an hour or more out: beyond the default 1-minute
    // resident window, all are far after the checkpoint.
    assert_eq!(r["resident_window_ms"], 60_000);
    assert_eq!(r["relocate_far_bytes"], 16 << 20);
    assert_eq!(r["far_tasks_after_recovery"], 1000, "{r}");
    if cfg!(target_os = "linux") {
        // Both kinds were scheduled: each has a figure (its sign and size
        // at 2 000 tasks are allocator noise, so only presence is checked).
        assert!(r["ram_bytes_per_wheel_task"].as_f64().is_some(), "{r}");
        assert!(r["ram_bytes_per_overflow_task"].as_f64().is_some(), "{r}");
    }
}

#[test]
fn resident_window_off_keeps_the_horizon_in_the_wheel() {
    let r = small_bench(&["--far-fraction", "0", "--resident-window", "off"]);
    assert!(r["resident_window_ms"].is_null(), "{r}");
    assert_eq!(r["far_tasks_after_recovery"], 0, "{r}");
    let r = small_bench(&["--far-fraction", "0", "--resident-window", "30m"]);
    assert_eq!(r["resident_window_ms"], 1_800_000);
    assert_eq!(r["far_tasks_after_recovery"], 1000, "{r}");
}

#[test]
fn all_near_tasks_report_no_overflow_figure() {
    let r = small_bench(&["--far-fraction", "0"]);
    assert_eq!(r["overflow_tasks"], 0);
    assert!(r["ram_bytes_per_overflow_task"].is_null(), "{r}");
}

#[test]
fn default_temporary_directory_is_removed_and_text_output_names_the_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(KAIROS)
        .args(["bench", "--tasks", "500", "--durability", "buffered"])
        .env("TMPDIR", tmp.path())
        .output()
        .expect("the kairos binary runs");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    if cfg!(unix) {
        // The temporary data directory was made under TMPDIR and removed.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
    for label in [
        "schedule",
        "cancel",
        "peak RSS",
        "RAM per wheel task",
        "RAM per overflow task",
        "disk",
        "checkpoint",
        "close",
        "recovery",
        "recovered pending",
        "temporary (removed)",
    ] {
        assert!(stdout.contains(label), "{label} missing in\n{stdout}");
    }
    assert!(stdout.contains("250 (expected 250"), "{stdout}");
}

#[test]
fn non_empty_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("precious.txt"), b"keep me").unwrap();
    let out = kairos(&[
        "bench",
        "--dir",
        dir.path().to_str().unwrap(),
        "--tasks",
        "10",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not empty"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read(dir.path().join("precious.txt")).unwrap(),
        b"keep me"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["bench", "--tasks", "100", "--far-fraction", "1.5"][..],
        &["bench", "--tasks", "100", "--far-fraction", "-0.1"],
        &["bench", "--tasks", "0"],
        &["bench"],
        &["bench", "--tasks", "100", "--durability", "eventually"],
        &["bench", "--tasks", "100", "--resident-window", "soon"],
        &["bench", "--tasks", "100", "--relocate-far-bytes", "0"],
        &["bench", "--tasks", "100", "--relocate-far-bytes", "lots"],
        &["bench", "--tasks", "100", "--interval-ms", "50"],
        &[
            "bench",
            "--tasks",
            "100",
            "--durability",
            "sync",
            "--interval-ms",
            "5",
        ],
    ] {
        let out = kairos(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

/// `--relocate-far-bytes`: with moves every 4 KiB of far tasks, background
/// moves take tasks out of the wheel before the explicit checkpoint (a
/// producer waits once two moves' worth is in memory, so every batch but
/// the last is out); with the default (16 MiB, 2^20 tasks) none does at this
/// size. Every task not cancelled still comes back, far.
#[test]
fn small_far_moves_take_tasks_out_before_the_checkpoint_and_lose_nothing() {
    let r = small_bench(&["--far-fraction", "1", "--relocate-far-bytes", "4096"]);
    assert_eq!(r["relocate_far_bytes"], 4096);
    let before = r["far_tasks_before_checkpoint"].as_u64().unwrap();
    assert!(before > 0, "{r}");
    assert_eq!(r["recovered_pending"], 1000, "{r}");
    assert_eq!(r["far_tasks_after_recovery"], 1000, "{r}");
    let r = small_bench(&["--far-fraction", "1"]);
    assert_eq!(r["far_tasks_before_checkpoint"], 0, "{r}");
    assert_eq!(r["far_tasks_after_recovery"], 1000, "{r}");
}

/// `--interval-ms` with `--durability interval` is used (and reported), and reaches the reopen.
#[test]
fn interval_ms_goes_with_interval_durability() {
    let dir = tempfile::tempdir().unwrap();
    let out = kairos(&[
        "bench",
        "--dir",
        dir.path().join("data").to_str().unwrap(),
        "--tasks",
        "200",
        "--durability",
        "interval",
        "--interval-ms",
        "7",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["interval_ms"], 7, "{r}");
    assert_eq!(r["ok"], true, "{r}");
}

/// `--log-tail`: records after the checkpoint are replayed by the reopen, and the
/// tasks they schedule and cancel are accounted for exactly.
#[test]
fn a_log_tail_after_the_checkpoint_is_replayed() {
    let r = small_bench(&["--log-tail", "400"]);
    assert_eq!(r["log_tail"], 400);
    assert_eq!(r["log_tail_cancelled"], 400);
    // 2 000 − 1 000 cancelled + 400 scheduled − 400 cancelled after the checkpoint.
    assert_eq!(r["recovered_pending"], 1000);
}

#[test]
fn a_log_tail_longer_than_the_even_tasks_is_refused() {
    let out = kairos(&["bench", "--tasks", "10", "--log-tail", "6"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("--log-tail 6 is more than the 5 tasks with an even index"),
        "{stderr}"
    );
}

/// Interrupted by SIGINT or SIGTERM mid-run, the bench removes its temporary data directory
/// (`Drop` does not run then) and exits with status 130.
#[cfg(unix)]
#[test]
fn an_interrupted_run_removes_its_temporary_directory() {
    for signal in ["INT", "TERM"] {
        let tmp = tempfile::tempdir().unwrap();
        // A million tasks one fdatasync each: still scheduling when the signal comes.
        let bench = Command::new(KAIROS)
            .args(["bench", "--tasks", "1000000", "--batch", "1"])
            .env("TMPDIR", tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the kairos binary runs");
        let started = std::time::Instant::now();
        // Until its directory holds the log (and the handler is installed).
        while !std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .any(|e| e.path().join("wal").is_dir())
        {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "no data directory"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        let killed = Command::new("kill")
            .args([format!("-{signal}"), bench.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let out = bench.wait_with_output().unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "SIG{signal}: {stderr}");
        assert!(
            stderr.contains("interrupted; removed the temporary directory"),
            "SIG{signal}: {stderr}"
        );
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "SIG{signal} left {left:?}");
    }
}

/// The resident window reported is the one the engine uses (`Config::far_span`): raised to the
/// payload window (60 s), capped at the 18-day horizon; the one given is reported beside it.
#[test]
fn the_resident_window_reported_is_the_one_used() {
    const DAY_MS: u64 = 86_400_000;
    for (given, used, given_ms) in [
        ("100d", 18 * DAY_MS, 100 * DAY_MS),
        ("0", 60_000, 0),
        ("500ms", 60_000, 500),
        ("2h", 7_200_000, 7_200_000),
    ] {
        let r = small_bench(&["--resident-window", given]);
        assert_eq!(r["resident_window_ms"], used, "{given}: {r}");
        assert_eq!(r["resident_window_given_ms"], given_ms, "{given}: {r}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    for (given, shown) in [
        ("100d", "18 d: tasks due later leave the wheel's memory (far) (--resident-window 100 d capped at the 18-day horizon)"),
        ("0", "60 s: tasks due later leave the wheel's memory (far) (--resident-window 0 s raised to the payload window)"),
    ] {
        let out = kairos(&[
            "bench",
            "--dir",
            data.join(given).to_str().unwrap(),
            "--tasks",
            "200",
            "--durability",
            "buffered",
            "--resident-window",
            given,
        ]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        assert!(stdout.contains(shown), "{given}: {stdout}");
    }
}

/// `--resident-window` takes `off` too, and its error says so.
#[test]
fn a_bad_resident_window_names_off() {
    let out = kairos(&["bench", "--tasks", "100", "--resident-window", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("use off, 0 or whole numbers"),
        "{}",
        text(&out.stderr)
    );
}

/// `--dir` given as a symbolic link to an empty directory is followed (it was refused as "exists
/// and is not a directory").
#[cfg(unix)]
#[test]
fn a_dir_given_as_a_symbolic_link_is_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = kairos(&[
        "bench",
        "--dir",
        link.to_str().unwrap(),
        "--tasks",
        "200",
        "--durability",
        "buffered",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(real.join("wal").is_dir());
}
