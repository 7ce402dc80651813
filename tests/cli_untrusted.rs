//! `kairos verify`, `inspect` and `dump` on directories damaged in ways the engine's open
//! tolerates or never looks at: each must say what it found, the three must agree, and none
//! may stay silent or call the wrong thing damage.
//!
//! - a torn mark slot in the newest segment of a cleanly closed log (benign by
//!   `wal/FORMAT.md`, "Mark slots": open rewrites it as empty) is reported as a warning with
//!   its file and byte offset; a torn slot in an older segment is damage;
//! - an orphan overflow file (one no checkpoint refers to: the next open removes it) that is
//!   damaged is a warning in `verify` and `inspect` alike, not a failure;
//! - a FIFO or a directory named like a log segment is reported (never waited on), and fails
//!   the check: the log cannot read it, and a segment it replaced would be lost;
//! - `dump` says "unreadable" for a file it cannot read (an I/O error), and keeps "damaged"
//!   for bad bytes.

#![cfg(all(feature = "cli", unix))]

mod common;

use common::cli::{copy_tree, json, path, run, KAIROS};
use common::{open_fs, TestResult, START_MS};
use kairos::overflow::{self, OVERFLOW_DIR_NAME};
use kairos::{Config, Engine, ManualClock};
use kairos_wal::format::parse_segment_file_name;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const HOUR: Duration = Duration::from_secs(3600);

fn config() -> Config {
    let mut c = Config::default();
    c.resident_window = None;
    c.payload_window = Some(Duration::from_secs(60));
    c.payload_prefetch = false;
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    c.segment_bytes = common::SMALL_SEGMENT_BYTES;
    c
}

/// A data directory, cleanly shut down, whose log has several segments and whose checkpoint
/// placed the payloads of tasks due in hours in overflow file 1.
fn build(dir: &Path) -> TestResult {
    let clock = ManualClock::new(START_MS);
    let engine = open_fs(dir, config(), &clock)?;
    for i in 0..40u32 {
        engine.schedule_after(format!("early:{i}").as_bytes(), HOUR * (i + 1), &[b'p'; 64])?;
    }
    let report = engine.checkpoint()?;
    assert!(report.payloads_moved > 0, "{report:?}");
    for i in 0..60u32 {
        engine.schedule_after(format!("late:{i}").as_bytes(), HOUR * (i + 1), &[b'q'; 64])?;
    }
    engine.shutdown()?;
    Ok(())
}

/// The segments of `dir`'s log, oldest first.
fn segments(dir: &Path) -> TestResult<Vec<PathBuf>> {
    let mut segs: Vec<(u64, PathBuf)> = std::fs::read_dir(dir.join("wal"))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (seq, _) = parse_segment_file_name(&name)?;
            Some((seq, e.path()))
        })
        .collect();
    segs.sort();
    Ok(segs.into_iter().map(|(_, p)| p).collect())
}

/// Tears mark slot `index` of segment `seg`: one byte of it changed, so its checksum fails.
fn tear_slot(seg: &Path, index: usize) -> TestResult<u64> {
    let offset = 64 + 32 * index;
    let mut bytes = std::fs::read(seg)?;
    bytes[offset + 3] ^= 0x5a;
    std::fs::write(seg, &bytes)?;
    Ok(offset as u64)
}

/// Runs `kairos ARGS` with a deadline (a FIFO must never block it): (status, stdout, stderr).
fn run_bounded(args: &[&str]) -> TestResult<(i32, String, String)> {
    let mut child = Command::new(KAIROS)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            child.kill()?;
            return Err(format!("{args:?} hung").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output()?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    Ok((out.status.code().unwrap_or(-1), stdout, stderr))
}

fn mkfifo(at: &Path) -> TestResult {
    let made = Command::new("mkfifo").arg(at).status()?;
    assert!(made.success(), "mkfifo {}", at.display());
    Ok(())
}

/// Finding 1: a torn mark slot of the newest segment, in a log that ended with a clean close.
/// The spec makes it benign (a crash tears at most the slot being written; open rewrites it as
/// empty), so the three tools pass — but each names it, by file and byte offset, instead of
/// saying nothing.
#[test]
fn a_torn_mark_slot_of_the_newest_segment_is_reported_not_silent() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    let dir = tmp.path().join("torn-slot");
    copy_tree(&built, &dir)?;
    let segs = segments(&dir)?;
    assert!(segs.len() >= 2, "{segs:?}");
    let newest = segs.last().ok_or("no segment")?.clone();
    let offset = tear_slot(&newest, 1)?;

    let v = json(&run(&["verify", "--json", path(&dir)], 0).0);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["clean_shutdown"], true, "{v}");
    let warnings = v["warnings"].as_array().ok_or("no warnings")?;
    let w = warnings
        .iter()
        .find(|w| w["file"].as_str().map(PathBuf::from) == Some(newest.clone()))
        .ok_or_else(|| format!("no warning names the torn slot: {v}"))?;
    assert_eq!(w["offset"], offset, "{w}");
    assert!(
        w["message"]
            .as_str()
            .is_some_and(|m| m.contains("mark slot 1") && m.contains("rewrites it")),
        "{w}"
    );
    let (stdout, _) = run(&["verify", path(&dir)], 0);
    assert!(stdout.contains("WARNING: mark slot 1"), "{stdout}");
    assert!(stdout.contains(&format!("offset  {offset}")), "{stdout}");

    let v = json(&run(&["inspect", "--json", path(&dir)], 0).0);
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        v["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["offset"] == offset)),
        "{v}"
    );
    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    assert!(stdout.contains("WARNING: mark slot 1"), "{stdout}");
    // Not the checkpoint warning's epilogue.
    assert!(
        !stdout.contains("opens from the older checkpoint"),
        "{stdout}"
    );

    let (_, stderr) = run(&["dump", path(&dir)], 0);
    assert!(stderr.contains("warning: mark slot 1"), "{stderr}");
    assert!(stderr.contains(&format!("offset  {offset}")), "{stderr}");

    // The open rewrites it as empty; afterwards nothing is reported.
    let engine = Engine::open(&dir, config())?;
    engine.shutdown()?;
    let v = json(&run(&["verify", "--json", path(&dir)], 0).0);
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");

    // The same slot torn in an older segment is damage (only the newest segment's slots are
    // ever written), in all three.
    let dir = tmp.path().join("torn-old-slot");
    copy_tree(&built, &dir)?;
    let segs = segments(&dir)?;
    let older = segs[segs.len() - 2].clone();
    let offset = tear_slot(&older, 1)?;
    let v = json(&run(&["verify", "--json", path(&dir)], 1).0);
    assert_eq!(
        v["error"]["file"].as_str().map(PathBuf::from),
        Some(older.clone())
    );
    assert_eq!(v["error"]["offset"], offset, "{v}");
    let v = json(&run(&["inspect", "--json", path(&dir)], 1).0);
    assert_eq!(v["error"]["offset"], offset, "{v}");
    let (_, stderr) = run(&["dump", path(&dir)], 1);
    assert!(stderr.contains("damaged log"), "{stderr}");
    assert!(Engine::open(&dir, config()).is_err());
    Ok(())
}

/// Finding 2: an overflow file no checkpoint refers to (an orphan, which the next open
/// removes) that is damaged: no data is lost, so `verify` and `inspect` both pass and both
/// warn, naming the file and the byte offset.
#[test]
fn a_damaged_orphan_overflow_file_is_a_warning_in_verify_and_inspect() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    let dir = tmp.path().join("orphan");
    copy_tree(&built, &dir)?;
    let ovf_dir = dir.join(OVERFLOW_DIR_NAME);
    let file1 = ovf_dir.join(overflow::file_name(1));
    let header = std::fs::read(&file1)?;
    let mut store_id = [0u8; 16];
    store_id.copy_from_slice(&header[16..32]);
    let mut writer = overflow::OverflowWriter::new(&store_id, 7);
    writer.push(
        999,
        START_MS + 1000 * HOUR.as_millis() as u64,
        b"gone",
        b"xyz",
    );
    let mut bytes = writer.finish();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    let orphan = ovf_dir.join(overflow::file_name(7));
    std::fs::write(&orphan, &bytes)?;
    let offset = match overflow::read_file(&kairos_wal::FsStorage, &orphan, None, Some(7)) {
        Err(overflow::OverflowReadError::Corrupt { offset, .. }) => offset,
        other => return Err(format!("the orphan reads as {other:?}").into()),
    };

    let v = json(&run(&["verify", "--json", path(&dir)], 0).0);
    assert_eq!(v["ok"], true, "{v}");
    let w = v["warnings"]
        .as_array()
        .and_then(|w| {
            w.iter()
                .find(|w| w["file"].as_str().map(PathBuf::from) == Some(orphan.clone()))
        })
        .ok_or_else(|| format!("verify does not name the orphan: {v}"))?;
    assert_eq!(w["offset"], offset, "{w}");
    assert!(
        w["message"]
            .as_str()
            .is_some_and(|m| m.contains("orphan") && m.contains("removes it")),
        "{w}"
    );
    let (stdout, _) = run(&["verify", path(&dir)], 0);
    assert!(stdout.contains("WARNING: orphan overflow file"), "{stdout}");

    let v = json(&run(&["inspect", "--json", path(&dir)], 0).0);
    assert_eq!(v["ok"], true, "{v}");
    assert!(v["error"].is_null(), "{v}");
    let files = v["overflow"]["files"].as_array().ok_or("no files")?;
    let f7 = files.iter().find(|f| f["number"] == 7).ok_or("no file 7")?;
    assert_eq!(f7["orphan"], true, "{f7}");
    assert_eq!(f7["damage"]["offset"], offset, "{f7}");
    assert!(
        v["warnings"]
            .as_array()
            .is_some_and(|w| w.iter().any(|w| w["offset"] == offset)),
        "{v}"
    );
    let (stdout, _) = run(&["inspect", path(&dir)], 0);
    assert!(stdout.contains("WARNING: orphan overflow file"), "{stdout}");

    // The open removes it and opens.
    let engine = Engine::open(&dir, config())?;
    engine.shutdown()?;
    assert!(!orphan.exists());
    Ok(())
}

/// Finding 3: a FIFO, and a directory, named like log segments. The log lists regular files
/// only, so the engine's open does not see them; the tools name them (without waiting on the
/// FIFO) and fail: a segment replaced by one is lost to the log.
#[test]
fn a_fifo_or_a_directory_named_like_a_segment_is_reported() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    let segs = segments(&built)?;
    let newest = segs.last().ok_or("no segment")?;
    let name = newest
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no name")?;
    let (seq, _) = parse_segment_file_name(name).ok_or("unparsed")?;
    // A name above the newest segment, as a lost newest segment would have.
    let next = format!("{:016x}-{:016x}.seg", seq + 1, 1_000_000);
    for (kind, make) in [
        ("FIFO", mkfifo as fn(&Path) -> TestResult),
        ("directory", |p: &Path| Ok(std::fs::create_dir(p)?)),
    ] {
        let dir = tmp.path().join(kind);
        copy_tree(&built, &dir)?;
        let odd = dir.join("wal").join(&next);
        make(&odd)?;
        let d = path(&dir);
        for args in [
            &["verify", d][..],
            &["verify", "--json", d],
            &["inspect", d],
            &["inspect", "--json", d],
            &["dump", d],
        ] {
            let (status, stdout, stderr) = run_bounded(args)?;
            let all = format!("{stdout}{stderr}");
            assert_eq!(status, 1, "{args:?}: {all}");
            assert!(all.contains(&next), "{args:?}: {all}");
            assert!(
                all.contains(&format!("is a {kind}, not a regular file")),
                "{args:?}: {all}"
            );
        }
        // The engine's open does not list it: it opens (nothing it knows of is missing).
        let engine = Engine::open(&dir, config())?;
        engine.shutdown()?;
    }

    // A FIFO in place of a segment between two others: the open refuses the gap, and the
    // tools say both the gap and what is there instead.
    let dir = tmp.path().join("fifo-middle");
    copy_tree(&built, &dir)?;
    let segs = segments(&dir)?;
    let middle = segs[segs.len() - 2].clone();
    std::fs::remove_file(&middle)?;
    mkfifo(&middle)?;
    let middle_name = middle
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("no name")?
        .to_owned();
    for args in [
        &["verify", path(&dir)][..],
        &["inspect", path(&dir)],
        &["dump", path(&dir)],
    ] {
        let (status, stdout, stderr) = run_bounded(args)?;
        let all = format!("{stdout}{stderr}");
        assert_eq!(status, 1, "{args:?}: {all}");
        assert!(all.contains("missing"), "{args:?}: {all}");
        assert!(
            all.contains(&format!("{middle_name} is a FIFO, not a regular file")),
            "{args:?}: {all}"
        );
    }
    assert!(Engine::open(&dir, config()).is_err());
    Ok(())
}

/// Finding 4: `dump` calls a file it could not read unreadable (with the I/O error), and a
/// file with bad bytes damaged.
#[test]
fn dump_tells_an_unreadable_file_from_a_damaged_one() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;

    // The log's META a FIFO: an I/O error ("not a regular file"), not bad bytes.
    let dir = tmp.path().join("meta-fifo");
    copy_tree(&built, &dir)?;
    let meta = dir.join("wal").join("META");
    std::fs::remove_file(&meta)?;
    mkfifo(&meta)?;
    let (status, _, stderr) = run_bounded(&["dump", path(&dir)])?;
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("unreadable log"), "{stderr}");
    assert!(stderr.contains("is not a regular file"), "{stderr}");
    assert!(!stderr.contains("damaged"), "{stderr}");

    // The overflow file the checkpoint refers to replaced by a FIFO.
    let dir = tmp.path().join("ovf-fifo");
    copy_tree(&built, &dir)?;
    let file1 = dir.join(OVERFLOW_DIR_NAME).join(overflow::file_name(1));
    std::fs::remove_file(&file1)?;
    mkfifo(&file1)?;
    let (status, _, stderr) = run_bounded(&["dump", path(&dir)])?;
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("unreadable overflow file"), "{stderr}");
    assert!(!stderr.contains("damaged"), "{stderr}");
    // Named with its article: "an overflow file", not "a overflow file".
    assert!(
        stderr.contains("though named like an overflow file"),
        "{stderr}"
    );
    assert!(!stderr.contains("a overflow file"), "{stderr}");

    // The checkpoint replaced by a directory... is not listed (checkpoints are regular files);
    // a checkpoint that is a FIFO likewise. Bad bytes in it are damage.
    let dir = tmp.path().join("ckpt-flip");
    copy_tree(&built, &dir)?;
    let ckpt_dir = dir.join(kairos::checkpoint::CHECKPOINT_DIR_NAME);
    let ckpt = std::fs::read_dir(&ckpt_dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .ok_or("no checkpoint")?;
    let mut bytes = std::fs::read(&ckpt)?;
    bytes[70] ^= 0x01;
    std::fs::write(&ckpt, &bytes)?;
    let (status, _, stderr) = run_bounded(&["dump", path(&dir)])?;
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("damaged checkpoint"), "{stderr}");

    // A segment with bad bytes: damaged.
    let dir = tmp.path().join("seg-flip");
    copy_tree(&built, &dir)?;
    let segs = segments(&dir)?;
    let mut bytes = std::fs::read(&segs[0])?;
    bytes[200] ^= 0x01;
    std::fs::write(&segs[0], &bytes)?;
    let (status, _, stderr) = run_bounded(&["dump", path(&dir)])?;
    assert_eq!(status, 1, "{stderr}");
    assert!(stderr.contains("damaged log"), "{stderr}");
    Ok(())
}

/// Finding 5: an overflow file whose length is huge — sparse, or padded with zeros — was read
/// whole into one allocation of its length before a byte of it was checked, so `verify`,
/// `inspect` and `dump` aborted ("memory allocation of … bytes failed") or ate the machine's
/// memory. Each now reads it a window at a time and names its first bad entry, file and byte
/// offset: a failure when the header is bad, a warning when what is bad is only zeros after
/// the entries tasks need (the engine opens, and reads only those).
#[test]
fn a_huge_sparse_overflow_file_fails_at_its_first_bad_entry_without_reading_it_whole() -> TestResult
{
    const HUGE: u64 = 1 << 40;
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    for zeros_only in [false, true] {
        let dir = tmp.path().join(format!("sparse-{zeros_only}"));
        copy_tree(&built, &dir)?;
        let file1 = dir.join(OVERFLOW_DIR_NAME).join(overflow::file_name(1));
        // The whole file kept and a sparse tail of zeros after it (the first bad entry is at
        // its old end), or nothing but zeros (a bad header, at 0).
        let offset = if zeros_only {
            std::fs::write(&file1, b"")?;
            0
        } else {
            std::fs::metadata(&file1)?.len()
        };
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file1)?
            .set_len(HUGE)?;
        let d = path(&dir);
        for args in [
            &["verify", d][..],
            &["verify", "--json", d],
            &["inspect", d],
            &["inspect", "--json", d],
            &["dump", d],
            &["dump", "--json", "--key", "late:1", d],
        ] {
            let (status, stdout, stderr) = run_bounded(args)?;
            let all = format!("{stdout}{stderr}");
            // Zeros after the last entry: no live task needs what is there, and the engine
            // opens (it reads the header, and only the entries tasks need), so the tools name
            // it as a warning; a bad header fails them.
            let want = if zeros_only { 1 } else { 0 };
            assert_eq!(status, want, "{args:?}: {all}");
            assert!(!all.contains("memory allocation"), "{args:?}: {all}");
            assert!(
                all.contains(&format!(
                    "{} is corrupt at byte offset {offset}",
                    file1.display()
                )),
                "{args:?}: {all}"
            );
        }
        if !zeros_only {
            // As verify says: the engine opens, and every task comes with its payload.
            let clock = ManualClock::new(START_MS + 61 * 3_600_000);
            let engine = open_fs(&dir, config(), &clock)?;
            let ds = common::drain(&engine)?;
            assert_eq!(ds.len(), 100);
            assert!(ds.iter().all(|d| d.payload().len() == 64));
            engine.shutdown()?;
        }
    }
    Ok(())
}

/// Finding 6: a checkpoint from another data directory (its store id not the log's). The
/// engine's open refuses it before replaying anything; the tools never compared the two, so
/// one whose tasks keep their payloads in memory passed `verify`, and one naming overflow
/// files was blamed on them ("belongs to another data directory") instead of on itself.
#[test]
fn a_checkpoint_from_another_data_directory_is_named_as_such() -> TestResult {
    let tmp = tempfile::tempdir()?;
    // Payloads in overflow files (`build`), or all in memory.
    let in_memory = |dir: &Path| -> TestResult {
        let mut c = config();
        c.payload_window = None;
        let clock = ManualClock::new(START_MS);
        let engine = open_fs(dir, c, &clock)?;
        for i in 0..20u32 {
            engine.schedule_after(format!("k:{i}").as_bytes(), HOUR * (i + 1), b"p")?;
        }
        engine.checkpoint()?;
        for i in 20..30u32 {
            engine.schedule_after(format!("k:{i}").as_bytes(), HOUR * (i + 1), b"p")?;
        }
        engine.shutdown()?;
        Ok(())
    };
    for (name, make) in [
        ("overflow", build as fn(&Path) -> TestResult),
        ("memory", in_memory),
    ] {
        // Two directories made by the same calls: the same LSNs, ids and files, but each
        // its own store id.
        let (ours, theirs) = (
            tmp.path().join(format!("{name}-ours")),
            tmp.path().join(format!("{name}-theirs")),
        );
        make(&ours)?;
        make(&theirs)?;
        let ckpt_dir = kairos::checkpoint::CHECKPOINT_DIR_NAME;
        let ckpt = std::fs::read_dir(ours.join(ckpt_dir))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "ckpt"))
            .ok_or("no checkpoint")?;
        let ckpt_name = ckpt.file_name().ok_or("no name")?;
        std::fs::copy(theirs.join(ckpt_dir).join(ckpt_name), &ckpt)?;
        assert!(Engine::open(&ours, config()).is_err(), "{name}");

        let d = path(&ours);
        let v = json(&run(&["verify", "--json", d], 1).0);
        assert_eq!(
            v["error"]["file"].as_str().map(PathBuf::from),
            Some(ckpt.clone()),
            "{name}: {v}"
        );
        assert_eq!(v["error"]["offset"], 16, "{name}: {v}");
        assert!(
            v["error"]["message"].as_str().is_some_and(|m| m
                .contains("belongs to another data directory")
                && m.contains("checkpoint")),
            "{name}: {v}"
        );
        let v = json(&run(&["inspect", "--json", d], 1).0);
        assert_eq!(
            v["error"]["file"].as_str().map(PathBuf::from),
            Some(ckpt.clone()),
            "{name}: {v}"
        );
        let (_, stderr) = run(&["dump", d], 1);
        assert!(stderr.contains("damaged checkpoint"), "{name}: {stderr}");
        assert!(
            stderr.contains(&format!("checkpoint {} belongs to", ckpt.display())),
            "{name}: {stderr}"
        );
    }
    Ok(())
}

/// Finding 7: a directory where the data directory's `LOCK` or the log's belongs. The engine's
/// open cannot lock it and fails ("Is a directory"); `verify`, `inspect` and `dump` said
/// every record checks and exited 0. They now name it and fail.
#[test]
fn a_directory_in_place_of_a_lock_file_fails_as_the_open_does() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let built = tmp.path().join("built");
    build(&built)?;
    for (name, lock) in [("data", "LOCK"), ("log", "wal/LOCK")] {
        let dir = tmp.path().join(name);
        copy_tree(&built, &dir)?;
        let lock = dir.join(lock);
        std::fs::remove_file(&lock)?;
        std::fs::create_dir(&lock)?;
        let d = path(&dir);
        for args in [&["verify", d][..], &["inspect", d], &["dump", d]] {
            let (stdout, stderr) = run(args, 1);
            assert!(
                format!("{stdout}{stderr}").contains(&format!(
                    "{} is a directory where the engine's lock file belongs",
                    lock.display()
                )),
                "{args:?}: {stdout}{stderr}"
            );
        }
        let v = json(&run(&["verify", "--json", d], 1).0);
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(
            v["not_regular_files"][0]["file"]
                .as_str()
                .map(PathBuf::from),
            Some(lock.clone()),
            "{v}"
        );
        assert!(Engine::open(&dir, config()).is_err(), "{name}");
    }
    // A dangling symbolic link there: reported the same way; the open fails without creating
    // the link's target outside the directory.
    #[cfg(unix)]
    for (name, lock) in [("data-link", "LOCK"), ("log-link", "wal/LOCK")] {
        let dir = tmp.path().join(name);
        copy_tree(&built, &dir)?;
        let lock = dir.join(lock);
        let target = tmp.path().join(format!("{name}-outside"));
        std::fs::remove_file(&lock)?;
        std::os::unix::fs::symlink(&target, &lock)?;
        let d = path(&dir);
        for args in [&["verify", d][..], &["inspect", d], &["dump", d]] {
            let (stdout, stderr) = run(args, 1);
            assert!(
                format!("{stdout}{stderr}").contains(&format!(
                    "{} is a symbolic link to nothing where the engine's lock file belongs",
                    lock.display()
                )),
                "{args:?}: {stdout}{stderr}"
            );
        }
        assert!(Engine::open(&dir, config()).is_err(), "{name}");
        assert!(
            !target.exists(),
            "{name}: the open created the link's target"
        );
    }
    Ok(())
}
