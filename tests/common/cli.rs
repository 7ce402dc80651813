//! Running the `kairos` binary from the CLI tests: exit status checked, no panic, JSON read.

use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

/// The binary under test.
pub const KAIROS: &str = env!("CARGO_BIN_EXE_kairos");

/// Runs the binary with `args`.
pub fn kairos<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(KAIROS)
        .args(args)
        .output()
        .expect("the kairos binary runs")
}

/// Bytes as text, lossily.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the binary and asserts its exit status and that it did not panic; returns
/// (stdout, stderr).
pub fn run<S: AsRef<OsStr>>(args: &[S], status: i32) -> (String, String) {
    let out = kairos(args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_owned()).collect();
    assert_eq!(
        out.status.code(),
        Some(status),
        "kairos {shown:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "kairos {shown:?}: {stderr}");
    (stdout, stderr)
}

/// A path as `&str` (temporary paths are UTF-8).
pub fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

/// One JSON value.
pub fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// One JSON value per line.
pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout.lines().map(json).collect()
}

/// Copies a directory tree (a built data directory, to damage a copy of it).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Every file under `dir`, with its bytes (to check that a command wrote nothing).
pub fn tree_bytes(
    dir: &Path,
) -> super::TestResult<std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d)? {
            let p = entry?.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.insert(p.clone(), std::fs::read(&p)?);
            }
        }
    }
    Ok(out)
}
