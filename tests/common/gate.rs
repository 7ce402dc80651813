//! A storage wrapper that blocks one chosen open (or read) until the test releases it:
//! to make another thread (a checkpoint, a promotion) stop at a known I/O
//! step while the test runs calls against the engine.

use kairos_wal::storage::{LockGuard, OpenMode, Storage, StorageFile};
use kairos_wal::SimStorage;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

/// Blocks the first open of a path under a prefix, in one mode, until
/// released.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    target: Option<(PathBuf, OpenMode)>,
    /// The armed open panics instead of blocking (a bug in the thread
    /// doing it).
    panics: bool,
    /// A rename of the path is armed, not an open ([`Gate::arm_rename`]).
    rename: bool,
    hit: bool,
    released: bool,
    /// Reads of this path fail with EIO ([`Gate::fail_reads_of`]).
    failing: Option<PathBuf>,
}

impl Gate {
    /// Blocks the next read of `path`.
    pub fn arm(&self, path: &Path) {
        self.arm_mode(path, OpenMode::Read);
    }

    /// Blocks the next open in `mode` of a path under `prefix`.
    pub fn arm_mode(&self, prefix: &Path, mode: OpenMode) {
        let mut s = self.state.lock().unwrap();
        s.target = Some((prefix.to_path_buf(), mode));
        s.panics = false;
        s.rename = false;
        s.hit = false;
        s.released = false;
    }

    /// Blocks the next rename of a path under `prefix` (made durable and
    /// named: a new overflow file is complete, its moves not applied).
    pub fn arm_rename(&self, prefix: &Path) {
        self.arm_mode(prefix, OpenMode::Read);
        self.state.lock().unwrap().rename = true;
    }

    /// Makes the next open in `mode` of a path under `prefix` panic.
    pub fn arm_panic(&self, prefix: &Path, mode: OpenMode) {
        self.arm_mode(prefix, mode);
        self.state.lock().unwrap().panics = true;
    }

    /// Makes every later read of `path` through [`GateStorage`] fail with
    /// EIO (after passing the gate): a read blocked at the gate fails once
    /// released.
    pub fn fail_reads_of(&self, path: &Path) {
        self.state.lock().unwrap().failing = Some(path.to_path_buf());
    }

    /// Lets reads succeed again after [`Gate::fail_reads_of`].
    pub fn stop_failing_reads(&self) {
        self.state.lock().unwrap().failing = None;
    }

    /// Whether reads of `path` fail ([`Gate::fail_reads_of`]).
    fn fails_reads_of(&self, path: &Path) -> bool {
        self.state.lock().unwrap().failing.as_deref() == Some(path)
    }

    /// Whether the armed open happened.
    pub fn was_hit(&self) -> bool {
        self.state.lock().unwrap().hit
    }

    /// Called by [`GateStorage`] at every open: blocks the armed one (or
    /// panics, [`Gate::arm_panic`]).
    pub fn on_open(&self, path: &Path, mode: OpenMode) {
        self.pass(path, Some(mode));
    }

    /// Called by [`GateStorage`] at every rename (of `from`): blocks the
    /// armed one ([`Gate::arm_rename`]).
    pub fn on_rename(&self, from: &Path) {
        self.pass(from, None);
    }

    /// Blocks (or panics at) the armed operation: an open in a mode, or a
    /// rename (`mode` None).
    fn pass(&self, path: &Path, mode: Option<OpenMode>) {
        let mut s = self.state.lock().unwrap();
        match &s.target {
            Some((prefix, m))
                if path.starts_with(prefix)
                    && match mode {
                        Some(mode) => !s.rename && *m == mode,
                        None => s.rename,
                    } => {}
            _ => return,
        }
        s.target = None;
        s.hit = true;
        self.cv.notify_all();
        if s.panics {
            drop(s);
            panic!("simulated bug at the open of {}", path.display());
        }
        while !s.released {
            s = self.cv.wait(s).unwrap();
        }
    }

    /// Waits until the armed open is blocked.
    pub fn wait_hit(&self) {
        let mut s = self.state.lock().unwrap();
        while !s.hit {
            s = self.cv.wait(s).unwrap();
        }
    }

    /// Lets the blocked open go on.
    pub fn release(&self) {
        self.state.lock().unwrap().released = true;
        self.cv.notify_all();
    }
}

/// [`SimStorage`] whose opens pass a [`Gate`].
#[derive(Debug, Clone)]
pub struct GateStorage {
    /// The storage underneath.
    pub inner: SimStorage,
    /// The gate every open passes.
    pub gate: Arc<Gate>,
}

impl Storage for GateStorage {
    fn allows_timed_io(&self) -> bool {
        self.inner.allows_timed_io()
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        self.gate.on_open(path, mode);
        let file = self.inner.open(path, mode)?;
        Ok(match mode {
            // A file kept open (the engine keeps overflow files open for
            // reads of single entries) passes the gate at each read.
            OpenMode::Read => Box::new(GateFile {
                inner: file,
                gate: Arc::clone(&self.gate),
                path: path.to_path_buf(),
            }),
            _ => file,
        })
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.gate.on_rename(from);
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        self.inner.lock(path)
    }
    fn random_id(&self) -> io::Result<[u8; 16]> {
        self.inner.random_id()
    }
    fn now_ms(&self) -> u64 {
        self.inner.now_ms()
    }
}

/// A file opened for reading through [`GateStorage`]: each read passes the
/// gate as an open in [`OpenMode::Read`] would.
#[derive(Debug)]
struct GateFile {
    inner: Box<dyn StorageFile>,
    gate: Arc<Gate>,
    path: PathBuf,
}

impl StorageFile for GateFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.gate.on_open(&self.path, OpenMode::Read);
        if self.gate.fails_reads_of(&self.path) {
            return Err(io::Error::from_raw_os_error(5));
        }
        self.inner.read_at(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
}
