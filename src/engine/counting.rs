//! A storage wrapper for unit tests that counts, per overflow file, the
//! opens, the read calls and the bytes read (`engine::payloads`'s prefetch
//! rounds and `engine::far`'s promotion count their I/O with it).

use crate::overflow;
use kairos_wal::storage::{LockGuard, OpenMode, Storage, StorageFile};
use kairos_wal::SimStorage;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// What [`Counting`] saw of one overflow file (or of all of them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    /// Opens, in any mode.
    pub(crate) opens: u64,
    /// `read_at` calls.
    pub(crate) reads: u64,
    /// Bytes those calls read.
    pub(crate) bytes: u64,
}

impl std::ops::Sub for Seen {
    type Output = Seen;
    fn sub(self, before: Seen) -> Seen {
        Seen {
            opens: self.opens - before.opens,
            reads: self.reads - before.reads,
            bytes: self.bytes - before.bytes,
        }
    }
}

type SeenByFile = Arc<parking_lot::Mutex<BTreeMap<String, Seen>>>;

/// Simulated storage that counts, per overflow file, the opens, the reads
/// and the bytes read ([`Seen`]).
#[derive(Debug, Clone)]
pub(crate) struct Counting {
    pub(crate) sim: SimStorage,
    seen: SeenByFile,
}

impl Counting {
    pub(crate) fn new(sim: SimStorage) -> Counting {
        Counting {
            sim,
            seen: Arc::default(),
        }
    }

    /// What was seen of overflow file `file` so far.
    pub(crate) fn seen(&self, file: u32) -> Seen {
        let seen = self.seen.lock();
        seen.get(&overflow::file_name(file))
            .copied()
            .unwrap_or_default()
    }

    /// What was seen of all overflow files so far.
    pub(crate) fn seen_total(&self) -> Seen {
        let seen = self.seen.lock();
        seen.values().fold(Seen::default(), |all, s| Seen {
            opens: all.opens + s.opens,
            reads: all.reads + s.reads,
            bytes: all.bytes + s.bytes,
        })
    }

    /// Opens and bytes read from overflow file `file` so far.
    pub(crate) fn of(&self, file: u32) -> (u64, u64) {
        let s = self.seen(file);
        (s.opens, s.bytes)
    }

    /// Opens and bytes read from all overflow files so far.
    pub(crate) fn total(&self) -> (u64, u64) {
        let s = self.seen_total();
        (s.opens, s.bytes)
    }

    /// The overflow file's name, if `path` is one.
    fn overflow_name(path: &Path) -> Option<String> {
        let name = path.file_name()?.to_str()?;
        overflow::parse_file_name(name).map(|_| name.to_owned())
    }
}

impl Storage for Counting {
    fn allows_timed_io(&self) -> bool {
        self.sim.allows_timed_io()
    }
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.sim.create_dir_all(path)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> std::io::Result<Box<dyn StorageFile>> {
        let inner = self.sim.open(path, mode)?;
        let Some(name) = Counting::overflow_name(path) else {
            return Ok(inner);
        };
        self.seen.lock().entry(name.clone()).or_default().opens += 1;
        Ok(Box::new(CountingFile {
            inner,
            name,
            seen: Arc::clone(&self.seen),
        }))
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        self.sim.list(dir)
    }
    fn exists(&self, path: &Path) -> std::io::Result<bool> {
        self.sim.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.sim.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.sim.remove_file(path)
    }
    fn sync_dir(&self, path: &Path) -> std::io::Result<()> {
        self.sim.sync_dir(path)
    }
    fn lock(&self, path: &Path) -> std::io::Result<Box<dyn LockGuard>> {
        self.sim.lock(path)
    }
    fn random_id(&self) -> std::io::Result<[u8; 16]> {
        self.sim.random_id()
    }
    fn now_ms(&self) -> u64 {
        self.sim.now_ms()
    }
}

/// An open overflow file of [`Counting`].
#[derive(Debug)]
struct CountingFile {
    inner: Box<dyn StorageFile>,
    name: String,
    seen: SeenByFile,
}

impl StorageFile for CountingFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        let n = self.inner.read_at(buf, offset)?;
        let mut seen = self.seen.lock();
        let s = seen.entry(self.name.clone()).or_default();
        s.reads += 1;
        s.bytes += n as u64;
        Ok(n)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.inner.write_all_at(buf, offset)
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.inner.sync_data()
    }
}
