//! [`FsStorage`]: the real file system.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use super::{LockGuard, OpenMode, Storage, StorageFile};

/// The real file system through `std::fs`: positional reads and writes, `fdatasync`
/// (`File::sync_data`), directory fsync (`File::sync_all` on the opened directory) and lock
/// files through `File::try_lock` (an advisory `flock` on Unix; stable since Rust 1.89).
/// New files get mode 0600 and new directories 0700 on Unix, as etcd's `PrivateFileMode` does.
///
/// Locks are advisory and unreliable on network file systems (NFS).
#[derive(Clone, Copy, Debug, Default)]
pub struct FsStorage;

/// An open file of [`FsStorage`].
#[derive(Debug)]
struct FsFile {
    file: File,
}

/// A held lock file of [`FsStorage`]; closing the file releases the lock.
#[derive(Debug)]
struct FsLock {
    file: File,
}

impl LockGuard for FsLock {}

impl Drop for FsLock {
    fn drop(&mut self) {
        // Closing the descriptor releases the lock anyway; unlocking first is explicit.
        let _ = self.file.unlock();
    }
}

fn open_options(mode: OpenMode) -> OpenOptions {
    let mut options = OpenOptions::new();
    match mode {
        OpenMode::Read => {
            options.read(true);
        }
        OpenMode::ReadWrite => {
            options.read(true).write(true);
        }
        OpenMode::CreateNew => {
            options.read(true).write(true).create_new(true);
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options
}

impl Storage for FsStorage {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(path)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        // Only regular files: opening a FIFO put where a log file belongs (by mistake, or in a
        // directory the reader does not trust) would block until someone writes to it, and a
        // device would read whatever it yields. (`list` names only regular files already.) A
        // check before the open, not on the open file: a FIFO swapped in between the two by
        // someone racing the reader still blocks it.
        if !matches!(mode, OpenMode::CreateNew) && !std::fs::metadata(path)?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            ));
        }
        let file = open_options(mode).open(path)?;
        Ok(Box::new(FsFile { file }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            // `DirEntry::file_type` does not follow symlinks: only regular files count.
            if !entry.file_type()?.is_file() {
                continue;
            }
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        let file = open_lock_file(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(FsLock { file })),
            Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "lock is held by another open",
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Opens the lock file at `path`, creating it if it is missing — never
/// through a symbolic link: a dangling link in its place would otherwise have
/// its target created, a file outside the data directory. An existing file
/// (or a link to one) is opened as it is; a missing one is created with
/// `O_EXCL`, which follows no link, so a dangling link fails it and is
/// reported as such.
fn open_lock_file(path: &Path) -> io::Result<File> {
    let mut existing = OpenOptions::new();
    existing.read(true).write(true);
    match existing.open(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => return other,
    }
    let mut create = OpenOptions::new();
    create.read(true).write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        create.mode(0o600);
    }
    match create.open(path) {
        // Made meanwhile by another open (which then holds the lock, or
        // will), or a dangling symbolic link.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            existing.open(path).map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a symbolic link to nothing; not followed (it would create a \
                         file outside the data directory)",
                        path.display()
                    ),
                ),
                _ => e,
            })
        }
        other => other,
    }
}

#[cfg(unix)]
impl StorageFile for FsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        loop {
            match self.file.read_at(buf, offset) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.write_all_at(buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

#[cfg(windows)]
impl StorageFile for FsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        use std::os::windows::fs::FileExt;
        self.file.seek_read(buf, offset)
    }

    fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        use std::os::windows::fs::FileExt;
        while !buf.is_empty() {
            let n = self.file.seek_write(buf, offset)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote zero bytes"));
            }
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}
