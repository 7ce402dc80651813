//! [`SimStorage`]: an in-memory file system for crash and fault tests.
//!
//! Model (after SQLite's crash VFS `src/test6.c`, redb's crash-consistency backend and
//! TigerBeetle's `src/testing/storage.zig`):
//!
//! - Every file (inode) has its *current* bytes (what reads see, i.e. the page cache) and its
//!   *durable* bytes (what the disk holds), plus the list of writes and length changes made
//!   since its last `sync_data`, in order.
//! - The namespace has a current and a durable view too, plus the ordered log of creates,
//!   renames and removes not yet made durable by `sync_dir` of their directory.
//! - Directories themselves are durable as soon as they are created (a simplification: the log
//!   creates its directory once, before anything else).
//! - [`SimStorage::power_cut`] keeps the durable state plus a seeded random subset of the
//!   unsynced writes, each possibly torn at 512-byte sectors into new / zero / garbage / stale
//!   bytes, and a seeded random prefix of the unsynced directory operations.
//! - Every file also remembers what the medium still holds past its durable end (bytes a
//!   synced truncation cut off): with [`SimStorage::set_stale_history`] on, a power cut may
//!   show those old bytes again where unsynced writes did not land.
//! - Handles and locks carry the epoch they were made in; a power cut or process crash starts
//!   a new epoch and every older handle fails with EIO. So does every call through a
//!   [`SimStorage::process`] view made before it (the dead process's threads touch nothing).
//! - With [`SimStorage::set_free_bytes`], the disk has a capacity: the files' lengths may add
//!   up to at most that many bytes, and a write that would pass it stores the part that fits,
//!   then fails with ENOSPC (a full disk).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{FaultKind, FaultOp, FaultPlan, LockGuard, OpenMode, Storage, StorageFile};

/// Sector size at which [`SimStorage::power_cut`] tears unsynced writes, in bytes.
pub const SIM_SECTOR_BYTES: u64 = 512;

/// The constant wall clock of [`SimStorage`] (`Storage::now_ms`), in ms since the Unix epoch.
pub const SIM_NOW_MS: u64 = 1_700_000_000_000;

const EIO: i32 = 5;
const ENOSPC: i32 = 28;

/// An in-memory [`Storage`] that is deterministic from a seed and can lose power.
///
/// Cloning is cheap and every clone sees the same files (an `Arc` inside), so a test keeps one
/// clone to cut the power while the log holds another.
///
/// What it keeps apart: synced and unsynced bytes per file, and synced and unsynced directory
/// entries. What it can do to them: [`power_cut`](Self::power_cut) (tear and drop unsynced
/// state at random), [`power_cut_drop_unsynced`](Self::power_cut_drop_unsynced) (drop exactly
/// all unsynced state), [`crash_process`](Self::crash_process) (keep everything written), and
/// [`inject`](Self::inject) (fail the n-th matching operation with EIO, ENOSPC or a short
/// write). It counts operations ([`io_ops`](Self::io_ops)) and file syncs
/// ([`sync_count`](Self::sync_count)). [`set_stale_history`](Self::set_stale_history) makes
/// power cuts harsher: stale sectors may show bytes from before a truncation.
/// [`set_free_bytes`](Self::set_free_bytes) fills the disk up to a given room.
///
/// Simplifications: directories are durable at once; locks are in memory only (no lock file
/// appears); a failed `sync_data` makes nothing durable but keeps the writes pending (a real
/// kernel may drop them — a correct log never retries, so it cannot tell the difference).
#[derive(Clone)]
pub struct SimStorage {
    inner: Arc<Mutex<SimState>>,
    /// `Some(epoch)` for a [`process`](Self::process) view: the epoch of the "process" whose
    /// calls it carries; every call by path fails with EIO once that epoch has passed.
    process_epoch: Option<u64>,
}

impl std::fmt::Debug for SimStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.inner.lock();
        f.debug_struct("SimStorage")
            .field("files", &state.names.len())
            .field("epoch", &state.epoch)
            .field("io_ops", &state.io_ops)
            .finish_non_exhaustive()
    }
}

type InodeId = u64;

/// SplitMix64: small, seedable, good enough to pick crash outcomes.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; returns 0 for `n == 0`).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

#[derive(Debug)]
enum PendingOp {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<PendingOp>,
    /// Operations ever added to `pending`: the sequence number of the next one. A sync with
    /// latency makes durable those numbered below this count at its start.
    pushed: u64,
    /// What the medium still holds at each offset past the durable end: bytes a durable
    /// truncation cut off (zeros where nothing was, and in every sector a synced write
    /// rewrote). Read only by power cuts with [`SimStorage::set_stale_history`] on.
    ghost: Vec<u8>,
}

#[derive(Debug)]
enum DirOp {
    Create {
        path: PathBuf,
        ino: InodeId,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
        ino: InodeId,
    },
    Remove {
        path: PathBuf,
    },
}

impl DirOp {
    /// The directory whose sync makes this operation durable.
    fn dir(&self) -> Option<&Path> {
        match self {
            DirOp::Create { path, .. } | DirOp::Remove { path } => path.parent(),
            DirOp::Rename { to, .. } => to.parent(),
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, InodeId>) {
        match self {
            DirOp::Create { path, ino } => {
                names.insert(path.clone(), *ino);
            }
            DirOp::Rename { from, to, ino } => {
                names.remove(from);
                names.insert(to.clone(), *ino);
            }
            DirOp::Remove { path } => {
                names.remove(path);
            }
        }
    }
}

#[derive(Debug)]
struct ArmedFault {
    remaining: u64,
    op: FaultOp,
    kind: FaultKind,
}

/// Operation classes, for fault matching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpClass {
    Other,
    Write,
    Sync,
    Open,
    Rename,
}

#[derive(Debug)]
struct SimState {
    rng: Rng,
    epoch: u64,
    dirs: BTreeSet<PathBuf>,
    names: BTreeMap<PathBuf, InodeId>,
    durable_names: BTreeMap<PathBuf, InodeId>,
    dir_log: Vec<DirOp>,
    inodes: HashMap<InodeId, Inode>,
    next_ino: InodeId,
    locks: HashMap<PathBuf, (u64, u64)>,
    next_lock_id: u64,
    faults: Vec<ArmedFault>,
    /// Injected faults that have fired ([`SimStorage::faults_fired`]).
    faults_fired: u64,
    io_ops: u64,
    sync_count: u64,
    /// The thread of each file fdatasync, in order (see `sync_threads`).
    sync_threads: Vec<std::thread::ThreadId>,
    sync_latency: std::time::Duration,
    /// [`SimStorage::set_stale_history`].
    stale_history: bool,
    /// [`SimStorage::set_timed_io`].
    timed_io: bool,
    /// [`SimStorage::set_free_bytes`]: the most bytes the files' lengths may add up to.
    capacity: Option<u64>,
}

fn os_error(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

/// Normalises a path so that `a/b`, `a//b` and `a/./b/` name the same entry.
fn normalize(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

impl SimState {
    /// Counts one operation and returns the fault to inject into it, if one is due.
    fn begin_op(&mut self, class: OpClass) -> Option<FaultKind> {
        self.io_ops += 1;
        let mut fired = None;
        let mut index = 0;
        while index < self.faults.len() {
            let fault = &mut self.faults[index];
            let matches = match fault.op {
                FaultOp::Any => true,
                FaultOp::Write => class == OpClass::Write,
                FaultOp::Sync => class == OpClass::Sync,
                FaultOp::Open => class == OpClass::Open,
                FaultOp::Rename => class == OpClass::Rename,
            };
            if matches {
                if fault.remaining == 0 && fired.is_none() {
                    fired = Some(fault.kind);
                    self.faults_fired += 1;
                    self.faults.remove(index);
                    continue;
                }
                fault.remaining = fault.remaining.saturating_sub(1);
            }
            index += 1;
        }
        fired
    }

    /// Fails a non-write operation if a fault fired.
    fn check(&mut self, class: OpClass) -> io::Result<()> {
        match self.begin_op(class) {
            None => Ok(()),
            Some(FaultKind::Enospc) => Err(os_error(ENOSPC)),
            Some(FaultKind::Eio | FaultKind::ShortWrite) => Err(os_error(EIO)),
        }
    }

    fn require_dir(&self, dir: &Path) -> io::Result<()> {
        if self.dirs.contains(dir) {
            Ok(())
        } else {
            Err(not_found(dir))
        }
    }

    fn require_parent(&self, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(parent) => self.require_dir(parent),
            None => Err(not_found(path)),
        }
    }

    /// Bytes the disk holds: the lengths of the files that have a name now, added up.
    fn used_bytes(&self) -> u64 {
        self.names
            .values()
            .filter_map(|ino| self.inodes.get(ino))
            .map(|inode| inode.current.len() as u64)
            .sum()
    }

    /// How many more bytes the files may grow by ([`SimStorage::set_free_bytes`]); `None`: no
    /// limit.
    fn room(&self) -> Option<u64> {
        self.capacity
            .map(|capacity| capacity.saturating_sub(self.used_bytes()))
    }

    fn new_epoch(&mut self) {
        self.epoch += 1;
        self.locks.clear();
        self.faults.clear();
    }

    /// Drops inodes no durable name refers to.
    fn collect_garbage(&mut self) {
        let live: BTreeSet<InodeId> = self.names.values().copied().collect();
        self.inodes.retain(|ino, _| live.contains(ino));
    }

    /// The disk image a power cut leaves of one inode: durable bytes plus a random subset of
    /// pending operations, writes possibly torn per sector. A truncation that survives leaves
    /// the bytes it cut off in the inode's ghost. With `stale_history`, a region the image
    /// grows over without new bytes landing there shows the ghost instead of zeros.
    fn cut_image(rng: &mut Rng, inode: &mut Inode, stale_history: bool) -> Vec<u8> {
        let mut image = inode.durable.clone();
        let mut stale = stale_history.then(|| inode.ghost.clone());
        for op in &inode.pending {
            match op {
                PendingOp::SetLen(len) => {
                    if rng.below(2) == 0 {
                        shrink_into_ghost(&mut inode.ghost, &image, usize_of(*len));
                        if let Some(stale) = &mut stale {
                            shrink_into_ghost(stale, &image, usize_of(*len));
                        }
                        image.resize(usize_of(*len), 0);
                    }
                }
                PendingOp::Write { offset, data } => match rng.below(100) {
                    0..=34 => write_over(&mut image, *offset, data, stale.as_deref()),
                    35..=59 => {}
                    _ => tear_into(rng, &mut image, *offset, data, stale.as_deref()),
                },
            }
        }
        image
    }
}

fn usize_of(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Writes `data` at `offset`, zero-extending the image as a file system would.
fn write_into(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    write_over(image, offset, data, None);
}

/// [`write_into`], except that a gap the write opens past the image's end shows `ghost` (what
/// the medium held there) rather than zeros, when given.
fn write_over(image: &mut Vec<u8>, offset: u64, data: &[u8], ghost: Option<&[u8]>) {
    let start = usize_of(offset);
    let end = start.saturating_add(data.len());
    if image.len() < end {
        let old_len = image.len();
        image.resize(end, 0);
        if let Some(ghost) = ghost {
            let gap_end = start.min(ghost.len());
            if old_len < gap_end {
                image[old_len..gap_end].copy_from_slice(&ghost[old_len..gap_end]);
            }
        }
    }
    image[start..end].copy_from_slice(data);
}

/// A durable truncation of `image` to `len`: the bytes cut off stay on the medium (`ghost`),
/// except the rest of the sector holding the new end, which the file system zeroes.
fn shrink_into_ghost(ghost: &mut Vec<u8>, image: &[u8], len: usize) {
    if len < image.len() {
        if ghost.len() < image.len() {
            ghost.resize(image.len(), 0);
        }
        ghost[len..image.len()].copy_from_slice(&image[len..]);
        let sector_end = usize_of((len as u64).div_ceil(SIM_SECTOR_BYTES) * SIM_SECTOR_BYTES);
        ghost[len..sector_end.min(image.len())].fill(0);
    }
}

/// A synced write of `[offset, offset + bytes)`: the sectors it touched now hold file bytes
/// (and zeros past the end), not whatever they held before.
fn rewrite_ghost(ghost: &mut [u8], offset: u64, bytes: usize) {
    let start = usize_of(offset / SIM_SECTOR_BYTES * SIM_SECTOR_BYTES);
    let end = usize_of((offset + bytes as u64).div_ceil(SIM_SECTOR_BYTES) * SIM_SECTOR_BYTES);
    let end = end.min(ghost.len());
    if start < end {
        ghost[start..end].fill(0);
    }
}

/// Applies a write sector by sector: each 512-byte piece independently becomes the new bytes,
/// stays stale (the image's old bytes), becomes zeros, or becomes garbage. A stale piece past
/// the image's end leaves nothing there, so if a later piece lands the gap shows zeros — or,
/// with `ghost`, the bytes the medium held before.
fn tear_into(rng: &mut Rng, image: &mut Vec<u8>, offset: u64, data: &[u8], ghost: Option<&[u8]>) {
    let mut position = offset;
    let end = offset + data.len() as u64;
    while position < end {
        let sector_end = ((position / SIM_SECTOR_BYTES) + 1) * SIM_SECTOR_BYTES;
        let piece_end = sector_end.min(end);
        let piece = &data[usize_of(position - offset)..usize_of(piece_end - offset)];
        match rng.below(4) {
            0 => write_over(image, position, piece, ghost),
            1 => {}
            2 => write_over(image, position, &vec![0u8; piece.len()], ghost),
            _ => {
                let garbage: Vec<u8> = (0..piece.len()).map(|_| rng.next_u64() as u8).collect();
                write_over(image, position, &garbage, ghost);
            }
        }
        position = piece_end;
    }
}

impl SimStorage {
    /// A new, empty file system whose random choices (crash outcomes, store ids, short-write
    /// lengths) all derive from `seed`.
    pub fn new(seed: u64) -> Self {
        let state = SimState {
            rng: Rng(seed),
            epoch: 0,
            dirs: BTreeSet::from([PathBuf::from("/"), PathBuf::new()]),
            names: BTreeMap::new(),
            durable_names: BTreeMap::new(),
            dir_log: Vec::new(),
            inodes: HashMap::new(),
            next_ino: 1,
            locks: HashMap::new(),
            next_lock_id: 1,
            faults: Vec::new(),
            faults_fired: 0,
            io_ops: 0,
            sync_count: 0,
            sync_threads: Vec::new(),
            sync_latency: std::time::Duration::ZERO,
            stale_history: false,
            timed_io: false,
            capacity: None,
        };
        SimStorage {
            inner: Arc::new(Mutex::new(state)),
            process_epoch: None,
        }
    }

    /// A view of the same files for one "process": it works like `self` until the next
    /// [`power_cut`](Self::power_cut), [`power_cut_drop_unsynced`](Self::power_cut_drop_unsynced)
    /// or [`crash_process`](Self::crash_process), after which every call through it — by path
    /// too (`open`, `create_dir_all`, `list`, `exists`, `rename`, `remove_file`, `sync_dir`,
    /// `lock`) — fails with EIO, as handles already do. A test that cuts the power under a
    /// running log or engine opens it on such a view, so that a thread of the dead process
    /// (a writer mid-roll, a checkpoint) cannot rename, create or sync anything in the image
    /// the cut left; the next open takes a fresh view. Calls through `self` (and through plain
    /// clones) are never cut off.
    pub fn process(&self) -> SimStorage {
        SimStorage {
            inner: Arc::clone(&self.inner),
            process_epoch: Some(self.inner.lock().epoch),
        }
    }

    /// Power loss. Every file keeps its synced bytes plus a seeded random subset of its unsynced
    /// writes and length changes, each write possibly torn at 512-byte sectors into new bytes,
    /// zeros, garbage or stale bytes (so unsynced data is lost, torn, zeroed or reordered). A
    /// seeded random prefix of the unsynced creates/renames/removes survives; the rest are
    /// undone. Every handle and lock taken before the cut is dead afterwards (its calls fail
    /// with EIO), so a dropped engine cannot write into the new image. Pending injected faults
    /// are cleared.
    ///
    /// Calls by path (`open`, `create_dir_all`, `rename`, `remove_file`, `list`, `sync_dir`)
    /// through `self` or a plain clone are *not* cut off: they act on the new image, from any
    /// caller. A test that cuts the power under a running log or engine (whose threads may
    /// still roll a segment, rename or remove files) opens it on a [`process`](Self::process)
    /// view, whose every call fails after the cut.
    pub fn power_cut(&self) {
        let mut guard = self.inner.lock();
        let state = &mut *guard;
        let keep = usize_of(state.rng.below(state.dir_log.len() as u64 + 1));
        for op in state.dir_log.drain(..).take(keep) {
            op.apply(&mut state.durable_names);
        }
        state.names = state.durable_names.clone();
        state.collect_garbage();
        let mut inos: Vec<InodeId> = state.inodes.keys().copied().collect();
        inos.sort_unstable();
        let stale_history = state.stale_history;
        for ino in inos {
            if let Some(inode) = state.inodes.get_mut(&ino) {
                let image = SimState::cut_image(&mut state.rng, inode, stale_history);
                inode.current = image.clone();
                inode.durable = image;
                inode.pending.clear();
            }
        }
        state.new_epoch();
    }

    /// Process crash: every written byte and directory operation survives (it is in the page
    /// cache) but stays exactly as durable as it was; every handle and lock dies (EIO). Calls
    /// by path go on working, as after [`power_cut`](Self::power_cut).
    pub fn crash_process(&self) {
        self.inner.lock().new_epoch();
    }

    /// Loses every unsynced byte, length change and directory operation exactly, with no
    /// tearing — the deterministic power cut. Handles and locks die as in
    /// [`power_cut`](Self::power_cut).
    pub fn power_cut_drop_unsynced(&self) {
        let mut guard = self.inner.lock();
        let state = &mut *guard;
        state.dir_log.clear();
        state.names = state.durable_names.clone();
        state.collect_garbage();
        for inode in state.inodes.values_mut() {
            inode.current = inode.durable.clone();
            inode.pending.clear();
        }
        state.new_epoch();
    }

    /// Arms a fault: the matching operation number `plan.after` from now (0 = the next one)
    /// fails once with `plan.kind`. Several faults may be armed at once; a power cut or crash
    /// disarms them all.
    pub fn inject(&self, plan: FaultPlan) {
        self.inner.lock().faults.push(ArmedFault {
            remaining: plan.after,
            op: plan.op,
            kind: plan.kind,
        });
    }

    /// Disarms every injected fault that has not fired yet.
    pub fn clear_faults(&self) {
        self.inner.lock().faults.clear();
    }

    /// Injected faults that have fired so far (each fails one operation). A test that
    /// records failures apart from the storage can tell by it that a failure it sees after
    /// [`SimStorage::clear_faults`] came from a fault that fired before.
    pub fn faults_fired(&self) -> u64 {
        self.inner.lock().faults_fired
    }

    /// Operations performed so far: every trait method call on the storage or its files
    /// (including ones that failed), except [`Storage::random_id`] and [`Storage::now_ms`].
    pub fn io_ops(&self) -> u64 {
        self.inner.lock().io_ops
    }

    /// `sync_data` calls so far (file fdatasyncs, successful or not; directory syncs are not
    /// counted).
    pub fn sync_count(&self) -> u64 {
        self.inner.lock().sync_count
    }

    /// The thread that made each `sync_data` call so far, in order (as counted by
    /// [`sync_count`](Self::sync_count)): tests tell the writer thread's syncs from a caller's.
    pub fn sync_threads(&self) -> Vec<std::thread::ThreadId> {
        self.inner.lock().sync_threads.clone()
    }

    /// The current (visible, possibly unsynced) bytes of the file at `path`, or `None` if no
    /// such file exists. Not counted as an operation.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.inner.lock();
        let ino = state.names.get(&normalize(path))?;
        state.inodes.get(ino).map(|inode| inode.current.clone())
    }

    /// The durable bytes (what a power cut cannot take) of the file now named `path`, or
    /// `None` if no such file exists: what its last completed fdatasync made durable, whatever
    /// was written since. Not counted as an operation.
    pub fn read_durable_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.inner.lock();
        let ino = state.names.get(&normalize(path))?;
        state.inodes.get(ino).map(|inode| inode.durable.clone())
    }

    /// Test tampering: replaces the file at `path` (creating it and its parent directories if
    /// needed) with `bytes`, durable at once. Not counted as an operation.
    pub fn write_file(&self, path: &Path, bytes: &[u8]) {
        let mut guard = self.inner.lock();
        let state = &mut *guard;
        let path = normalize(path);
        for ancestor in path.ancestors().skip(1) {
            state.dirs.insert(ancestor.to_path_buf());
        }
        let ino = match state.names.get(&path) {
            Some(ino) => *ino,
            None => {
                let ino = state.next_ino;
                state.next_ino += 1;
                state.names.insert(path.clone(), ino);
                ino
            }
        };
        state.durable_names.insert(path, ino);
        let inode = state.inodes.entry(ino).or_default();
        inode.current = bytes.to_vec();
        inode.durable = bytes.to_vec();
        inode.pending.clear();
    }

    /// Makes every later `sync_data` sleep for `latency` (outside the storage's lock) before
    /// it takes effect, like a real disk flush. Useful to make group commit observable. Such a
    /// sync makes durable only the file's writes made before it began: writes that land
    /// during the latency stay unsynced (a real fdatasync promises nothing for them).
    pub fn set_sync_latency(&self, latency: std::time::Duration) {
        self.inner.lock().sync_latency = latency;
    }

    /// Harsher power cuts (off by default): with `on`, a region that an unsynced write extends
    /// a file over without its bytes landing (a stale or dropped sector before one that did
    /// land) shows what the medium last held there — bytes a synced truncation cut off — instead
    /// of zeros. This is the "stale bytes" of `FORMAT.md`'s disk assumptions taken at its
    /// worst: a file system that reuses a truncated file's blocks without zeroing them (ext4
    /// `data=writeback`), so old frames can reappear behind a torn tail that recovery cut off.
    /// A sector a synced write rewrote no longer holds old bytes. Random choices are the same
    /// either way (the same seed tears the same sectors); only what a stale sector shows
    /// differs.
    pub fn set_stale_history(&self, on: bool) {
        self.inner.lock().stale_history = on;
    }

    /// A disk with `free` bytes of room left (`None`, the default: no limit). From now on the
    /// lengths of the files add up to at most their total now plus `free`: a write that would
    /// take them past that stores the prefix of its bytes that fits (none if none does), then
    /// fails with ENOSPC, as `pwrite` writes short on a full disk and the retry of the rest
    /// fails (`write_all_at`); a `set_len` that would grow a file past it fails with ENOSPC and
    /// has no effect. Writes over a file's existing bytes and truncations need no room, and
    /// room comes back as files shrink or go. Simplifications: space is counted in bytes of
    /// file length, not in blocks (a gap or a hole counts in full; directories, names and
    /// metadata take none), and a removed file's bytes are free at once, even while a handle
    /// to it is open. Power cuts and crashes keep the capacity; a power cut that takes unsynced
    /// bytes away leaves that much more room.
    pub fn set_free_bytes(&self, free: Option<u64>) {
        let mut state = self.inner.lock();
        state.capacity = free.map(|free| state.used_bytes().saturating_add(free));
    }

    /// The room left on a disk limited by [`set_free_bytes`](Self::set_free_bytes), in bytes;
    /// `None` without a limit. Not counted as an operation.
    pub fn free_bytes(&self) -> Option<u64> {
        self.inner.lock().room()
    }

    /// Lets the log do timed and background I/O on this storage (off by default; see
    /// [`Storage::allows_timed_io`]): with `on`, the writer records its idle high-water mark
    /// (`SYNCED`) and a `Buffered` or `Interval` log writes back as on a real disk, at the cost
    /// of I/O whose timing depends on the wall clock and on thread scheduling. A log asks once, when it opens: turning it off does not stop a log already
    /// open from writing its mark.
    pub fn set_timed_io(&self, on: bool) {
        self.inner.lock().timed_io = on;
    }
}

impl SimStorage {
    /// Locks the state for a call by path, failing with EIO when this is a
    /// [`process`](Self::process) view whose process a cut or crash has ended.
    fn state(&self) -> io::Result<parking_lot::MutexGuard<'_, SimState>> {
        let state = self.inner.lock();
        match self.process_epoch {
            Some(epoch) if epoch != state.epoch => Err(os_error(EIO)),
            _ => Ok(state),
        }
    }
}

impl Storage for SimStorage {
    fn allows_timed_io(&self) -> bool {
        self.inner.lock().timed_io
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut state = self.state()?;
        state.check(OpClass::Other)?;
        let path = normalize(path);
        if state.names.contains_key(&path) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file exists at this path",
            ));
        }
        for ancestor in path.ancestors() {
            state.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut guard = self.state()?;
        let state = &mut *guard;
        state.check(OpClass::Open)?;
        let path = normalize(path);
        state.require_parent(&path)?;
        let ino = match mode {
            OpenMode::Read | OpenMode::ReadWrite => match state.names.get(&path) {
                Some(ino) => *ino,
                None => return Err(not_found(&path)),
            },
            OpenMode::CreateNew => {
                if state.names.contains_key(&path) || state.dirs.contains(&path) {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} exists", path.display()),
                    ));
                }
                let ino = state.next_ino;
                state.next_ino += 1;
                state.inodes.insert(ino, Inode::default());
                state.names.insert(path.clone(), ino);
                state.dir_log.push(DirOp::Create {
                    path: path.clone(),
                    ino,
                });
                ino
            }
        };
        Ok(Box::new(SimFile {
            inner: Arc::clone(&self.inner),
            ino,
            epoch: state.epoch,
            writable: mode != OpenMode::Read,
            path,
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut state = self.state()?;
        state.check(OpClass::Other)?;
        let dir = normalize(dir);
        state.require_dir(&dir)?;
        let mut names: Vec<String> = state
            .names
            .keys()
            .filter(|path| path.parent() == Some(dir.as_path()))
            .filter_map(|path| path.file_name()?.to_str().map(str::to_owned))
            .collect();
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let mut state = self.state()?;
        state.check(OpClass::Other)?;
        let path = normalize(path);
        Ok(state.names.contains_key(&path) || state.dirs.contains(&path))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut guard = self.state()?;
        let state = &mut *guard;
        state.check(OpClass::Rename)?;
        let (from, to) = (normalize(from), normalize(to));
        state.require_parent(&to)?;
        let Some(ino) = state.names.remove(&from) else {
            return Err(not_found(&from));
        };
        state.names.insert(to.clone(), ino);
        state.dir_log.push(DirOp::Rename { from, to, ino });
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut guard = self.state()?;
        let state = &mut *guard;
        state.check(OpClass::Other)?;
        let path = normalize(path);
        if state.names.remove(&path).is_none() {
            return Err(not_found(&path));
        }
        state.dir_log.push(DirOp::Remove { path });
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut guard = self.state()?;
        let state = &mut *guard;
        state.check(OpClass::Sync)?;
        let dir = normalize(path);
        state.require_dir(&dir)?;
        let (synced, pending): (Vec<DirOp>, Vec<DirOp>) = state
            .dir_log
            .drain(..)
            .partition(|op| op.dir() == Some(dir.as_path()));
        for op in &synced {
            op.apply(&mut state.durable_names);
        }
        state.dir_log = pending;
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        let mut guard = self.state()?;
        let state = &mut *guard;
        state.check(OpClass::Other)?;
        let path = normalize(path);
        state.require_parent(&path)?;
        if let Some((epoch, _)) = state.locks.get(&path) {
            if *epoch == state.epoch {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    "lock is held by another open",
                ));
            }
        }
        let id = state.next_lock_id;
        state.next_lock_id += 1;
        state.locks.insert(path.clone(), (state.epoch, id));
        Ok(Box::new(SimLock {
            inner: Arc::clone(&self.inner),
            path,
            id,
        }))
    }

    fn random_id(&self) -> io::Result<[u8; 16]> {
        let mut state = self.inner.lock();
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&state.rng.next_u64().to_le_bytes());
        id[8..].copy_from_slice(&state.rng.next_u64().to_le_bytes());
        Ok(id)
    }

    fn now_ms(&self) -> u64 {
        SIM_NOW_MS
    }
}

/// A handle of [`SimStorage`]; dead (EIO) once its epoch has passed.
struct SimFile {
    inner: Arc<Mutex<SimState>>,
    ino: InodeId,
    epoch: u64,
    writable: bool,
    path: PathBuf,
}

impl std::fmt::Debug for SimFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFile")
            .field("path", &self.path)
            .field("ino", &self.ino)
            .field("epoch", &self.epoch)
            .finish_non_exhaustive()
    }
}

impl SimFile {
    /// Locks the state, counts the operation, checks the handle is alive and returns the
    /// fault due for it, if any.
    fn begin(
        &self,
        class: OpClass,
    ) -> io::Result<(parking_lot::MutexGuard<'_, SimState>, Option<FaultKind>)> {
        let mut state = self.inner.lock();
        let fault = state.begin_op(class);
        if state.epoch != self.epoch {
            return Err(os_error(EIO));
        }
        if class == OpClass::Write && !self.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "file was opened read-only",
            ));
        }
        Ok((state, fault))
    }
}

impl StorageFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let (state, fault) = self.begin(OpClass::Other)?;
        if fault.is_some() {
            return Err(os_error(EIO));
        }
        let Some(inode) = state.inodes.get(&self.ino) else {
            return Err(os_error(EIO));
        };
        let start = usize_of(offset);
        if start >= inode.current.len() {
            return Ok(0);
        }
        let n = buf.len().min(inode.current.len() - start);
        buf[..n].copy_from_slice(&inode.current[start..start + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (mut guard, fault) = self.begin(OpClass::Write)?;
        let state = &mut *guard;
        let data = match fault {
            None => buf,
            Some(FaultKind::Eio) => return Err(os_error(EIO)),
            Some(FaultKind::Enospc) => return Err(os_error(ENOSPC)),
            Some(FaultKind::ShortWrite) => {
                let n = usize_of(state.rng.below(buf.len() as u64));
                &buf[..n]
            }
        };
        let room = state.room();
        let Some(inode) = state.inodes.get_mut(&self.ino) else {
            return Err(os_error(EIO));
        };
        // A full disk: only the bytes up to the room left (from the file's end) land.
        let len = inode.current.len() as u64;
        let fits = room.map_or(data.len(), |room| {
            usize_of(len.saturating_add(room).saturating_sub(offset)).min(data.len())
        });
        let full = fits < data.len();
        let data = &data[..fits];
        if !data.is_empty() {
            write_into(&mut inode.current, offset, data);
            inode.pushed += 1;
            inode.pending.push(PendingOp::Write {
                offset,
                data: data.to_vec(),
            });
        }
        if fault.is_some() {
            return Err(os_error(EIO));
        }
        if full {
            return Err(os_error(ENOSPC));
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let (state, fault) = self.begin(OpClass::Other)?;
        if fault.is_some() {
            return Err(os_error(EIO));
        }
        match state.inodes.get(&self.ino) {
            Some(inode) => Ok(inode.current.len() as u64),
            None => Err(os_error(EIO)),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let (mut state, fault) = self.begin(OpClass::Write)?;
        match fault {
            None => {}
            Some(FaultKind::Enospc) => return Err(os_error(ENOSPC)),
            Some(_) => return Err(os_error(EIO)),
        }
        let room = state.room();
        let Some(inode) = state.inodes.get_mut(&self.ino) else {
            return Err(os_error(EIO));
        };
        let grows = len.saturating_sub(inode.current.len() as u64);
        if room.is_some_and(|room| grows > room) {
            return Err(os_error(ENOSPC));
        }
        inode.current.resize(usize_of(len), 0);
        inode.pushed += 1;
        inode.pending.push(PendingOp::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        // What a real fdatasync is sure to cover: the writes before it began. Writes that land
        // during its latency stay pending (a real one may or may not take them).
        let (latency, pushed_at_start) = {
            let state = self.inner.lock();
            let pushed = state.inodes.get(&self.ino).map(|inode| inode.pushed);
            (state.sync_latency, pushed)
        };
        if !latency.is_zero() {
            std::thread::sleep(latency);
        }
        let (mut state, fault) = self.begin(OpClass::Sync)?;
        state.sync_count += 1;
        state.sync_threads.push(std::thread::current().id());
        match fault {
            None => {}
            Some(FaultKind::Enospc) => return Err(os_error(ENOSPC)),
            Some(_) => return Err(os_error(EIO)),
        }
        let Some(inode) = state.inodes.get_mut(&self.ino) else {
            return Err(os_error(EIO));
        };
        // Without latency nothing can land in between: all of it. With it, the pending
        // operations made before this sync began (another sync may have made some durable
        // meanwhile: `pending` then starts later in the sequence).
        let covered = if latency.is_zero() {
            inode.pending.len()
        } else {
            let first = inode.pushed - inode.pending.len() as u64;
            let before = pushed_at_start.unwrap_or(0).saturating_sub(first);
            usize::try_from(before).map_or(inode.pending.len(), |n| n.min(inode.pending.len()))
        };
        for op in inode.pending.drain(..covered).collect::<Vec<_>>() {
            match op {
                PendingOp::Write { offset, data } => {
                    rewrite_ghost(&mut inode.ghost, offset, data.len());
                    write_into(&mut inode.durable, offset, &data);
                }
                PendingOp::SetLen(len) => {
                    shrink_into_ghost(&mut inode.ghost, &inode.durable, usize_of(len));
                    inode.durable.resize(usize_of(len), 0);
                }
            }
        }
        Ok(())
    }
}

/// A held lock of [`SimStorage`]; releases on drop unless a power cut or crash already did.
struct SimLock {
    inner: Arc<Mutex<SimState>>,
    path: PathBuf,
    id: u64,
}

impl std::fmt::Debug for SimLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimLock")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl LockGuard for SimLock {}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        if state
            .locks
            .get(&self.path)
            .is_some_and(|(_, id)| *id == self.id)
        {
            state.locks.remove(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 KiB of 0xAA, synced; truncated to 100 bytes, synced (the medium keeps what was cut
    /// off, past the first sector); 1500 bytes of 0x55 appended at 100, unsynced; power cut.
    fn stale_case(seed: u64, stale_history: bool) -> Vec<u8> {
        let sim = SimStorage::new(seed);
        let dir = Path::new("/d");
        let path = Path::new("/d/f");
        sim.create_dir_all(dir).expect("mkdir");
        let file = sim.open(path, OpenMode::CreateNew).expect("create");
        sim.sync_dir(dir).expect("sync dir");
        file.write_all_at(&[0xAA; 2048], 0).expect("write");
        file.sync_data().expect("sync");
        file.set_len(100).expect("truncate");
        file.sync_data().expect("sync");
        file.write_all_at(&[0x55; 1500], 100).expect("append");
        sim.set_stale_history(stale_history);
        sim.power_cut();
        sim.read_file(path).expect("file survives")
    }

    /// A process view works until a cut or crash, then every call by path through it fails
    /// (EIO) and changes nothing; the storage itself and a fresh view go on working.
    #[test]
    fn a_process_view_dies_with_its_process() {
        for end in [
            SimStorage::power_cut as fn(&SimStorage),
            SimStorage::power_cut_drop_unsynced,
            SimStorage::crash_process,
        ] {
            let sim = SimStorage::new(7);
            let dir = Path::new("/d");
            let view = sim.process();
            view.create_dir_all(dir).expect("mkdir");
            drop(
                view.open(Path::new("/d/a"), OpenMode::CreateNew)
                    .expect("create"),
            );
            view.sync_dir(dir).expect("sync dir");
            end(&sim);
            let dead = |r: io::Result<()>| {
                let e = r.expect_err("a dead process's call");
                assert_eq!(e.raw_os_error(), Some(EIO), "{e}");
            };
            dead(view.create_dir_all(Path::new("/e")));
            dead(view.open(Path::new("/d/b"), OpenMode::CreateNew).map(drop));
            dead(view.open(Path::new("/d/a"), OpenMode::Read).map(drop));
            dead(view.list(dir).map(drop));
            dead(view.exists(dir).map(drop));
            dead(view.rename(Path::new("/d/a"), Path::new("/d/c")));
            dead(view.remove_file(Path::new("/d/a")));
            dead(view.sync_dir(dir));
            dead(view.lock(Path::new("/d/LOCK")).map(drop));
            dead(view.clone().list(dir).map(drop));
            assert_eq!(sim.list(dir).expect("list"), vec!["a".to_owned()]);
            assert_eq!(sim.process().list(dir).expect("list"), vec!["a".to_owned()]);
        }
    }

    fn has_old_sector(image: &[u8]) -> bool {
        image
            .windows(SIM_SECTOR_BYTES as usize)
            .any(|w| w.iter().all(|&b| b == 0xAA))
    }

    #[test]
    fn stale_history_shows_what_a_synced_truncation_cut_off_and_tears_alike() {
        let mut shown = 0;
        for seed in 0..200 {
            let plain = stale_case(seed, false);
            let stale = stale_case(seed, true);
            assert_eq!(
                plain.len(),
                stale.len(),
                "seed {seed}: same tearing either way"
            );
            assert_eq!(
                &plain[..100],
                &[0xAA; 100][..],
                "seed {seed}: synced bytes kept"
            );
            assert!(
                !has_old_sector(&plain),
                "seed {seed}: old bytes without the option"
            );
            // The truncation zeroed the rest of its own sector: old bytes come back only from
            // the sectors after it.
            let first = &stale[100.min(stale.len())..512.min(stale.len())];
            assert!(
                !first.windows(16).any(|w| w.iter().all(|&b| b == 0xAA)),
                "seed {seed}: old bytes in the truncation's own sector"
            );
            if has_old_sector(&stale) {
                shown += 1;
            }
        }
        assert!(shown > 0, "no power cut showed the truncated bytes");
    }

    /// A full disk: a write stores what fits and fails with ENOSPC; overwrites and
    /// truncations need no room, and a truncation gives room back.
    #[test]
    fn free_bytes_model_a_full_disk() {
        let sim = SimStorage::new(1);
        let dir = Path::new("/d");
        sim.create_dir_all(dir).expect("mkdir");
        let file = sim
            .open(Path::new("/d/f"), OpenMode::CreateNew)
            .expect("create");
        file.write_all_at(&[1; 100], 0).expect("write");
        assert_eq!(sim.free_bytes(), None);
        sim.set_free_bytes(Some(50));
        assert_eq!(sim.free_bytes(), Some(50));
        let error = file
            .write_all_at(&[2; 80], 90)
            .expect_err("no room for 70 more bytes");
        assert_eq!(error.raw_os_error(), Some(ENOSPC));
        let bytes = sim.read_file(Path::new("/d/f")).expect("file");
        assert_eq!(bytes.len(), 150, "the 60 bytes that fit landed");
        assert!(bytes[90..].iter().all(|&b| b == 2));
        assert_eq!(sim.free_bytes(), Some(0));
        file.write_all_at(&[3; 150], 0)
            .expect("an overwrite needs no room");
        let other = sim
            .open(Path::new("/d/g"), OpenMode::CreateNew)
            .expect("create");
        let error = other
            .write_all_at(&[4; 1], 0)
            .expect_err("the disk is full");
        assert_eq!(error.raw_os_error(), Some(ENOSPC));
        assert_eq!(sim.read_file(Path::new("/d/g")), Some(Vec::new()));
        let error = other.set_len(1).expect_err("no room to grow");
        assert_eq!(error.raw_os_error(), Some(ENOSPC));
        file.set_len(120).expect("a truncation needs no room");
        assert_eq!(sim.free_bytes(), Some(30));
        other
            .write_all_at(&[4; 30], 0)
            .expect("the room given back");
        sim.remove_file(Path::new("/d/f")).expect("remove");
        assert_eq!(sim.free_bytes(), Some(120));
        sim.set_free_bytes(None);
        assert_eq!(sim.free_bytes(), None);
        other.write_all_at(&[5; 1000], 30).expect("no limit");
    }
}
