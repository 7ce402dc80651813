//! End-to-end tests of `kairos dead-letters list|requeue|purge DIR`: a data
//! directory with dead letters is built through the library (real file
//! system, manual clock, consumers that nack until the tasks die), then the
//! binary lists, requeues and purges them offline, and refuses a directory an
//! engine holds open.

#![cfg(feature = "cli")]

use kairos::{Config, Engine, ManualClock, NackOutcome, RecvError};
use kairos_wal::FsStorage;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

type TestResult<T = ()> = Result<T, Box<dyn std::error::Error>>;

const KAIROS: &str = env!("CARGO_BIN_EXE_kairos");

/// Wall time the manual clock starts at: 2023-11-14T22:13:20Z.
const START_MS: u64 = 1_700_000_000_000;
/// First attempts fall due this long after the start.
const DELAY: Duration = Duration::from_secs(1);
/// Nacks ask for the next attempt this long after.
const RETRY: Duration = Duration::from_millis(10);

/// The live task is due this long after the real time of the test.
const LIVE_DUE_IN: Duration = Duration::from_secs(30 * 86_400);

/// The dead letters' keys; the last is not UTF-8 (listed lossily).
const KEYS: [&[u8]; 3] = [b"order:1:timeout", b"order:2:timeout", b"bin:\xff\xfe"];

fn kairos(args: &[&str]) -> Output {
    Command::new(KAIROS)
        .args(args)
        .output()
        .expect("the kairos binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path(dir: &Path) -> &str {
    dir.to_str().expect("temporary paths are UTF-8")
}

/// Runs the binary, asserts its exit status, returns stdout.
fn run(args: &[&str], status: i32) -> String {
    let out = kairos(args);
    assert_eq!(
        out.status.code(),
        Some(status),
        "kairos {args:?}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Wall time now, UTC ms.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"))
}

/// The `list --json` entries.
fn listed(dir: &Path) -> Vec<Value> {
    let v = json(&run(&["dead-letters", "list", "--json", path(dir)], 0));
    v["dead_letters"].as_array().cloned().unwrap_or_default()
}

fn id_of(letter: &Value) -> u64 {
    letter["task_id"].as_u64().expect("a task id")
}

/// Builds `dir`: one dead letter per key in [`KEYS`] (2 attempts each, both
/// nacked), and a live task scheduled afterwards under the second key, so
/// that requeueing that dead letter finds its key taken. Returns the dead
/// letters' task ids in key order.
fn build(dir: &Path) -> TestResult<Vec<u64>> {
    let clock = ManualClock::new(START_MS);
    let mut config = Config::default();
    config.retry.max_attempts = 2;
    config.retry.backoff_jitter_percent = 0;
    let engine = Engine::open_with(dir, config, Arc::new(FsStorage), Arc::new(clock.clone()))?;
    for (i, key) in KEYS.iter().enumerate() {
        engine.schedule_after(key, DELAY, format!("payload {i}").as_bytes())?;
    }
    let consumer = engine.consumer();
    clock.advance(DELAY);
    let mut dead = Vec::new();
    for attempt in 1..=2 {
        engine.run_until_idle();
        for _ in KEYS {
            let d = consumer.try_recv()?;
            assert_eq!(d.attempt(), attempt);
            let error = format!("boom {} on attempt {attempt}", text(d.key()));
            match consumer.nack(&d, Some(RETRY), &error)? {
                NackOutcome::Retry { next_attempt, .. } => assert_eq!(next_attempt, 2),
                NackOutcome::DeadLettered => dead.push((d.key().to_vec(), d.task_id().0)),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(consumer.try_recv().err(), Some(RecvError::Empty));
        clock.advance(RETRY);
    }
    let ids: Vec<u64> = KEYS
        .iter()
        .map(|key| {
            dead.iter()
                .find(|(k, _)| k == key)
                .map(|&(_, id)| id)
                .expect("every key dead-lettered")
        })
        .collect();
    // The key of a dead letter is free again. Due in 30 days of real time, so
    // that no open by the binary (on the system clock) finds it due.
    engine.schedule_at(KEYS[1], SystemTime::now() + LIVE_DUE_IN, b"live")?;
    assert_eq!(engine.stats().dead_letters, 3);
    engine.shutdown()?;
    Ok(ids)
}

#[test]
fn list_requeue_and_purge_dead_letters_offline() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    let ids = build(&dir)?;

    // list --json: every field of every dead letter.
    let letters = listed(&dir);
    assert_eq!(letters.len(), 3, "{letters:?}");
    // Dead at the second nack: start + delay + retry.
    let dead_ms = START_MS + 1_000 + 10;
    for (i, letter) in letters.iter().enumerate() {
        assert_eq!(id_of(letter), ids[i], "oldest id first: {letter}");
        assert_eq!(letter["key"], text(KEYS[i]).as_str());
        assert_eq!(letter["attempts"], 2);
        assert_eq!(letter["dead_ms"], dead_ms);
        assert_eq!(letter["dead_at"], "2023-11-14T22:13:21.010Z");
        assert_eq!(letter["due_ms"], dead_ms, "due time of the last attempt");
        assert_eq!(letter["due_at"], "2023-11-14T22:13:21.010Z");
        assert_eq!(letter["payload_bytes"], format!("payload {i}").len());
        let error = format!("boom {} on attempt 2", text(KEYS[i]));
        assert_eq!(letter["error"], error.as_str());
    }
    assert_eq!(letters[2]["key"], "bin:\u{fffd}\u{fffd}");

    // list (text): a header and one line per dead letter.
    let out = run(&["dead-letters", "list", path(&dir)], 0);
    assert!(out.contains("3 dead letters in"), "{out}");
    assert!(out.contains("TASK_ID"), "{out}");
    // Both times in RFC 3339 (died, and due for the last attempt): the same instant here.
    assert!(out.contains("DUE_AT (UTC)"), "{out}");
    assert_eq!(out.matches("2023-11-14T22:13:21.010Z").count(), 6, "{out}");
    assert!(out.contains("\"order:1:timeout\""), "{out}");
    assert!(out.contains("boom order:2:timeout on attempt 2"), "{out}");
    assert_eq!(out.lines().count(), 2 + 3, "{out}");

    // requeue: one dead letter and one id that is none: exit 1, the good
    // one requeued all the same, the bad one reported.
    let first = ids[0].to_string();
    let before_ms = now_ms();
    let out = kairos(&[
        "dead-letters",
        "requeue",
        "--id",
        &first,
        "--id",
        "999999",
        "--delay",
        "10m",
        path(&dir),
    ]);
    let after_ms = now_ms();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("requeued dead letter {first} ")),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("no dead letter with task id 999999"),
        "{}",
        text(&out.stderr)
    );
    let left: Vec<u64> = listed(&dir).iter().map(id_of).collect();
    assert_eq!(left, ids[1..]);

    // requeue --all --json: the binary key is requeued, the key taken by a
    // live task fails with AlreadyExists (exit 1).
    let out = kairos(&[
        "dead-letters",
        "requeue",
        "--all",
        "--delay",
        "1h",
        "--json",
        path(&dir),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v = json(&text(&out.stdout));
    let requeued = v["requeued"].as_array().expect("requeued");
    assert_eq!(requeued.len(), 1, "{v}");
    assert_eq!(requeued[0]["task_id"], ids[2]);
    let new_id = requeued[0]["new_task_id"].as_u64().expect("a new id");
    assert!(new_id > ids[2], "{v}");
    let failed = v["failed"].as_array().expect("failed");
    assert_eq!(failed.len(), 1, "{v}");
    assert_eq!(failed[0]["task_id"], ids[1]);
    assert!(
        failed[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("already pending")),
        "{v}"
    );
    let left: Vec<u64> = listed(&dir).iter().map(id_of).collect();
    assert_eq!(left, [ids[1]]);

    // purge: an id that is no dead letter fails; --all purges the rest.
    let out = kairos(&["dead-letters", "purge", "--id", &first, path(&dir)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("no dead letter with task id {first}")));
    let v = json(&run(
        &["dead-letters", "purge", "--all", "--json", path(&dir)],
        0,
    ));
    assert_eq!(v["purged"], serde_json::json!([ids[1]]));
    assert_eq!(v["failed"], serde_json::json!([]));
    assert!(listed(&dir).is_empty());
    let out = run(&["dead-letters", "list", path(&dir)], 0);
    assert!(out.contains("no dead letters"), "{out}");
    let out = run(&["dead-letters", "purge", "--all", path(&dir)], 0);
    assert!(out.contains("no dead letters"), "{out}");

    // The application reopens the directory two hours later (a manual
    // clock): both requeued tasks are due, in requeue order, with a fresh
    // attempt count, their own key and payload, due 10 minutes and 1 hour
    // after their requeue; the live task is untouched; no dead letters left.
    let clock = ManualClock::new(now_ms() + 2 * 3_600_000);
    let engine = Engine::open_with(
        &dir,
        Config::default(),
        Arc::new(FsStorage),
        Arc::new(clock.clone()),
    )?;
    let stats = engine.stats();
    assert_eq!((stats.pending, stats.dead_letters), (3, 0), "{stats:?}");
    engine.run_until_idle();
    let consumer = engine.consumer();
    let d = consumer.try_recv()?;
    assert_eq!(
        (d.key(), d.attempt(), d.payload()),
        (KEYS[0], 1, &b"payload 0"[..])
    );
    let ten_minutes = 600_000;
    assert!(
        (before_ms + ten_minutes..=after_ms + ten_minutes + 1).contains(&d.due_ms()),
        "due {} not 10 min after the requeue ({before_ms}..={after_ms})",
        d.due_ms()
    );
    consumer.ack(&d)?;
    let d = consumer.try_recv()?;
    assert_eq!(
        (d.key(), d.attempt(), d.payload()),
        (KEYS[2], 1, &b"payload 2"[..])
    );
    assert!(d.due_ms() >= after_ms + 3_600_000, "{d:?}");
    consumer.ack(&d)?;
    assert_eq!(consumer.try_recv().err(), Some(RecvError::Empty));
    engine.shutdown()?;
    Ok(())
}

#[test]
fn a_directory_open_in_an_engine_is_refused() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("data");
    build(&dir)?;
    let engine = Engine::open(&dir, Config::default())?;
    for args in [
        &["dead-letters", "list", path(&dir)][..],
        &["dead-letters", "purge", "--all", path(&dir)],
        &["dead-letters", "requeue", "--all", path(&dir)],
    ] {
        let out = kairos(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains("open in another engine"), "{stderr}");
        assert!(stderr.contains("LOCK"), "{stderr}");
    }
    // Nothing changed underneath the engine.
    assert_eq!(engine.stats().dead_letters, 3);
    engine.shutdown()?;
    assert_eq!(listed(&dir).len(), 3);
    Ok(())
}

#[test]
fn bad_usage_and_directories_that_hold_no_log() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    // Exactly one of --id and --all; a delay with a unit.
    for args in [
        &["dead-letters", "requeue", path(dir)][..],
        &["dead-letters", "purge", path(dir)],
        &["dead-letters", "purge", "--id", "1", "--all", path(dir)],
        &[
            "dead-letters",
            "requeue",
            "--all",
            "--delay",
            "5",
            path(dir),
        ],
        &["dead-letters", "purge", "--id", "x", path(dir)],
        &["dead-letters", "list"],
        &["dead-letters"],
        // --interval-ms only goes with --durability interval (it was ignored).
        &["dead-letters", "list", "--interval-ms", "5", path(dir)],
        &["checkpoint", "--interval-ms", "5", path(dir)],
        &[
            "checkpoint",
            "--durability",
            "buffered",
            "--interval-ms",
            "5",
            path(dir),
        ],
    ] {
        assert_eq!(kairos(args).status.code(), Some(2), "{args:?}");
    }
    // A conflict found after parsing shows the usage of the subcommand given.
    let out = kairos(&[
        "dead-letters",
        "purge",
        "--all",
        "--interval-ms",
        "5",
        path(dir),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("Usage: kairos dead-letters purge "),
        "{}",
        text(&out.stderr)
    );
    // A directory without a log is refused, not turned into one.
    let out = kairos(&["dead-letters", "list", path(dir)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not a Kairos data directory"));
    assert!(!dir.join("LOCK").exists() && !dir.join("wal").exists());
    let missing = dir.join("missing");
    assert_eq!(
        kairos(&["dead-letters", "list", path(&missing)])
            .status
            .code(),
        Some(1)
    );
    assert!(!missing.exists());
    for args in [
        &["dead-letters", "--help"][..],
        &["dead-letters", "list", "--help"],
        &["dead-letters", "requeue", "--help"],
        &["dead-letters", "purge", "--help"],
    ] {
        let out = kairos(args);
        assert!(out.status.success(), "{args:?}");
        assert!(!out.stdout.is_empty());
    }
    Ok(())
}

/// The record types `kairos dump --json DIR` shows, in log order.
fn record_types(dir: &Path) -> Vec<String> {
    run(&["dump", "--json", path(dir)], 0)
        .lines()
        .map(|line| json(line)["type"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The offline commands open with deliveries paused: a task already due is not handed out
/// (no DELIVER, no RELEASE at shutdown); an application's next open delivers it, first
/// attempt.
#[test]
fn offline_commands_hand_out_no_due_task() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let mut config = Config::default();
    config.deliveries_paused = true;
    let engine = Engine::open(dir, config.clone())?;
    let due = SystemTime::now() - Duration::from_secs(3_600);
    engine.schedule_at(b"overdue", due, b"p")?;
    engine.shutdown()?;
    drop(engine);
    assert_eq!(record_types(dir), ["SCHEDULE"]);

    let v = json(&run(&["dead-letters", "list", "--json", path(dir)], 0));
    assert_eq!(v["dead_letters"], Value::Array(Vec::new()));
    let v = json(&run(&["checkpoint", "--json", path(dir)], 0));
    assert_eq!(v["tasks"], 1);
    let v = json(&run(
        &["dead-letters", "purge", "--all", "--json", path(dir)],
        0,
    ));
    assert_eq!(v["purged"], Value::Array(Vec::new()));
    let types = record_types(dir);
    assert!(
        !types.iter().any(|t| t == "DELIVER" || t == "RELEASE"),
        "an offline command handed a task out: {types:?}"
    );

    config.deliveries_paused = false;
    let engine = Engine::open(dir, config)?;
    engine.run_until_idle();
    let d = engine.consumer().try_recv()?;
    assert_eq!((d.key(), d.attempt()), (&b"overdue"[..], 1));
    engine.ack(&d)?;
    engine.shutdown()?;
    Ok(())
}
