//! A storage wrapper with lasting faults in chosen places, as a failing disk
//! has them: a byte range of one file that cannot be read (a bad sector), a
//! file that cannot be removed. Unlike `SimStorage`'s one-shot fault plans,
//! they fail every time, until cleared.

use kairos_wal::storage::{LockGuard, OpenMode, Storage, StorageFile};
use kairos_wal::SimStorage;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The lasting faults: file names are matched by suffix.
#[derive(Debug, Default)]
pub struct BadSpots {
    /// Reads touching this byte range of the file fail with EIO.
    pub unreadable: Option<(String, Range<u64>)>,
    /// Removing this file fails with EIO.
    pub unremovable: Option<String>,
}

/// [`SimStorage`] with [`BadSpots`].
#[derive(Debug, Clone)]
pub struct BadSpotStorage {
    pub inner: SimStorage,
    pub spots: Arc<Mutex<BadSpots>>,
}

impl BadSpotStorage {
    pub fn new(inner: SimStorage) -> BadSpotStorage {
        BadSpotStorage {
            inner,
            spots: Arc::default(),
        }
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

fn ends_with(path: &Path, suffix: &str) -> bool {
    path.to_string_lossy().ends_with(suffix)
}

impl Storage for BadSpotStorage {
    fn allows_timed_io(&self) -> bool {
        self.inner.allows_timed_io()
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        Ok(Box::new(BadSpotFile {
            inner: self.inner.open(path, mode)?,
            path: path.to_path_buf(),
            spots: Arc::clone(&self.spots),
        }))
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.inner.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let spots = self.spots.lock().map_err(|_| eio())?;
        if spots
            .unremovable
            .as_deref()
            .is_some_and(|s| ends_with(path, s))
        {
            return Err(eio());
        }
        drop(spots);
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

#[derive(Debug)]
struct BadSpotFile {
    inner: Box<dyn StorageFile>,
    path: PathBuf,
    spots: Arc<Mutex<BadSpots>>,
}

impl StorageFile for BadSpotFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let spots = self.spots.lock().map_err(|_| eio())?;
        if let Some((suffix, bad)) = &spots.unreadable {
            let end = offset + buf.len() as u64;
            if ends_with(&self.path, suffix) && offset < bad.end && end > bad.start {
                return Err(eio());
            }
        }
        drop(spots);
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
