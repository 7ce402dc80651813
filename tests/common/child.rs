//! Out-of-process crash tests (redb's and sled's crash loops): a test re-runs its own binary as
//! a child in "child mode" (chosen by an environment variable), reads the protocol lines the
//! child prints after each acknowledged call, and SIGKILLs it.

use super::{BoxError, TestResult};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// How long a child may take to answer before the parent gives up on it (a hung child must
/// fail the test, not hang it).
pub const CHILD_TIMEOUT: Duration = Duration::from_secs(120);

/// A child running this test binary in child mode.
pub struct ChildProc {
    child: Arc<Mutex<Child>>,
    lines: BufReader<ChildStdout>,
    stderr: Option<std::thread::JoinHandle<String>>,
    /// Marks protocol lines in the child's stdout (libtest writes `test NAME ... ` before
    /// running a test without a newline, so a protocol line may share its line with that).
    mark: &'static str,
    /// Dropping it stops the watchdog.
    _watchdog: mpsc::Sender<()>,
}

impl ChildProc {
    /// Starts this test binary running only `test`, with `env` set (which includes the
    /// variable that puts the test in child mode), reading lines marked with `mark`.
    pub fn spawn(test: &str, mark: &'static str, env: &[(&str, String)]) -> TestResult<ChildProc> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn()?;
        let lines = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut err = child.stderr.take().ok_or("no stderr")?;
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let child = Arc::new(Mutex::new(child));
        let (tx, rx) = mpsc::channel::<()>();
        let watched = Arc::clone(&child);
        std::thread::spawn(move || {
            if rx.recv_timeout(CHILD_TIMEOUT) == Err(mpsc::RecvTimeoutError::Timeout) {
                if let Ok(mut c) = watched.lock() {
                    let _ = c.kill();
                }
            }
        });
        Ok(ChildProc {
            child,
            lines,
            stderr: Some(stderr),
            mark,
            _watchdog: tx,
        })
    }

    /// The next protocol line, or `None` at the end of the child's output.
    pub fn next_line(&mut self) -> TestResult<Option<String>> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.lines.read_line(&mut line)? == 0 {
                return Ok(None);
            }
            if let Some(at) = line.find(self.mark) {
                return Ok(Some(line[at + self.mark.len()..].trim_end().to_string()));
            }
        }
    }

    /// SIGKILL (`Child::kill` sends SIGKILL on Unix).
    pub fn kill(&self) -> TestResult {
        self.child.lock().map_err(|_| "poisoned")?.kill()?;
        Ok(())
    }

    /// Waits for the child to end; returns whether it succeeded, and its stderr.
    pub fn wait(&mut self) -> TestResult<(bool, String)> {
        let status = self.child.lock().map_err(|_| "poisoned")?.wait()?;
        let err = match self.stderr.take() {
            Some(h) => h.join().unwrap_or_default(),
            None => String::new(),
        };
        Ok((status.success(), err))
    }

    /// Kills the child and fails with `what` and its stderr.
    pub fn fail(&mut self, what: String) -> BoxError {
        let _ = self.kill();
        let err = self.wait().map(|(_, e)| e).unwrap_or_default();
        format!("{what}\nchild stderr:\n{err}").into()
    }
}

/// In the child: prints one protocol line marked with `mark` and flushes it past any
/// buffering; the stdout lock keeps lines from different threads whole.
pub fn report(mark: &str, line: &str) -> TestResult {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{mark}{line}")?;
    out.flush()?;
    Ok(())
}
