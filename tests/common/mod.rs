//! Helpers shared by the integration tests: the test scale, a harness around an engine on
//! simulated storage with a manual clock, draining deliveries, and a small reader of the
//! log's segment files so torn-tail and corruption cases can aim at exact frames.
//!
//! Each test binary compiles this module on its own and uses only part of it.
#![allow(dead_code)]

pub mod bad_spots;
pub mod child;
#[cfg(feature = "cli")]
pub mod cli;
pub mod far;
pub mod gate;

use kairos::{
    CheckpointError, Config, Delivery, Durability, Engine, ManualClock, OpenError, RecvError,
};
use kairos_wal::format::{FrameHeader, FRAME_HEADER_BYTES, SEGMENT_FRAMES_OFFSET, SEGMENT_SUFFIX};
use kairos_wal::{SimStorage, Storage};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Error type of every test: anything, sendable across threads.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
/// What tests and their helpers return.
pub type TestResult<T = ()> = Result<T, BoxError>;

/// Wall time the manual clocks start at: 2023-11-14T22:13:20Z, a whole second (and a whole
/// 10 ms tick) so due times land on tick boundaries.
pub const START_MS: u64 = 1_700_000_000_000;

/// Smallest segment size the log accepts; makes every test roll segments often.
pub const SMALL_SEGMENT_BYTES: u64 = 4096;

/// The one knob for test sizes: `KAIROS_TEST_SCALE` (default 1, CI-sized). Sizes multiply by it.
pub fn scale() -> usize {
    std::env::var("KAIROS_TEST_SCALE")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&s| s >= 1)
        .unwrap_or(1)
}

/// `base × scale()`, capped at `cap`: a size that grows with the scale but stays bounded.
pub fn scaled(base: usize, cap: usize) -> usize {
    base.saturating_mul(scale()).min(cap).max(1)
}

/// A default configuration with tiny segments and the given durability.
///
/// The lease is the longest allowed (12 h): tests written before leases existed receive a
/// delivery and ack it much later in simulated time; lease behaviour has its own tests
/// (`tests/delivery.rs`).
pub fn config(durability: Durability) -> Config {
    let mut c = Config::default();
    c.segment_bytes = SMALL_SEGMENT_BYTES;
    c.durability = durability;
    c.lease = kairos::config::LEASE_MAX;
    // No background checkpoints: tests take them explicitly, deterministically.
    c.checkpoint_log_bytes = None;
    c.checkpoint_interval = None;
    // No background payload reads either (tests/overflow.rs turns them on).
    c.payload_prefetch = false;
    c
}

/// Whether a failed `Engine::checkpoint` poisoned the engine. `Poisoned` and `Wal` (syncing the
/// log failed) do, like any failed log sync; `Io` (writing the checkpoint or overflow file,
/// removing older ones), `Overflow` (a file being compacted did not read back) and `Trim`
/// (deleting the log segments covered) leave the engine usable.
pub fn checkpoint_error_poisons(e: &CheckpointError) -> bool {
    !matches!(
        e,
        CheckpointError::Io { .. } | CheckpointError::Overflow(_) | CheckpointError::Trim(_)
    )
}

/// `b"<prefix><i>"`.
pub fn key(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}{i}").into_bytes()
}

/// A payload that names its task and varies in length (0..=`len_max` filler bytes), so a
/// payload delivered to the wrong task or cut short is caught.
pub fn payload(tag: &str, i: usize, len_max: usize) -> Vec<u8> {
    let mut p = format!("{tag}#{i}#").into_bytes();
    let filler = if len_max == 0 {
        0
    } else {
        (i * 7919) % (len_max + 1)
    };
    p.extend((0..filler).map(|j| (i + j) as u8));
    p
}

/// Opens (or reopens) an engine on the real file system at `dir`, reading `clock`.
pub fn open_fs(dir: &Path, config: Config, clock: &ManualClock) -> Result<Engine, OpenError> {
    Engine::open_with(
        dir,
        config,
        Arc::new(kairos_wal::FsStorage),
        Arc::new(clock.clone()),
    )
}

/// Everything ready now: waits for the driver to hand out what is due at the clock's current
/// time, then receives without blocking until nothing is left.
/// An in-memory engine with `config` on a [`ManualClock`] at [`START_MS`].
pub fn memory_engine(config: Config) -> TestResult<(Engine, ManualClock)> {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(config, Arc::new(clock.clone()))?;
    Ok((engine, clock))
}

pub fn drain(engine: &Engine) -> TestResult<Vec<Delivery>> {
    engine.run_until_idle();
    let consumer = engine.consumer();
    let mut out = Vec::new();
    loop {
        match consumer.try_recv() {
            Ok(d) => out.push(d),
            Err(RecvError::Empty) => return Ok(out),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Advances `clock` by `by`, then [`drain`]s.
pub fn advance(clock: &ManualClock, engine: &Engine, by: Duration) -> TestResult<Vec<Delivery>> {
    clock.advance(by);
    drain(engine)
}

/// The deliveries' keys, as text, in order.
pub fn keys(ds: &[Delivery]) -> Vec<String> {
    ds.iter()
        .map(|d| String::from_utf8_lossy(d.key()).into_owned())
        .collect()
}

/// Deliveries as `(key, payload, due_ms)`, for comparing with a model.
pub fn triples(ds: &[Delivery]) -> Vec<(String, Vec<u8>, u64)> {
    ds.iter()
        .map(|d| {
            (
                String::from_utf8_lossy(d.key()).into_owned(),
                d.payload().to_vec(),
                d.due_ms(),
            )
        })
        .collect()
}

/// Tasks by key: (due_ms, payload).
pub type TaskMap = BTreeMap<Vec<u8>, (u64, Vec<u8>)>;

/// Deliveries as a map key → (due_ms, payload); fails if a key comes twice.
pub fn by_key(ds: &[Delivery]) -> TestResult<TaskMap> {
    let mut out = BTreeMap::new();
    for d in ds {
        if out
            .insert(d.key().to_vec(), (d.due_ms(), d.payload().to_vec()))
            .is_some()
        {
            return Err(
                format!("key {:?} delivered twice", String::from_utf8_lossy(d.key())).into(),
            );
        }
    }
    Ok(out)
}

/// An engine on [`SimStorage`] with a [`ManualClock`], reopenable after a clean shutdown, a
/// process crash or a power cut.
pub struct SimHarness {
    /// The simulated disk (a clone shares the same files).
    pub sim: SimStorage,
    /// The clock every incarnation of the engine reads.
    pub clock: ManualClock,
    /// The configuration every incarnation is opened with.
    pub config: Config,
    /// The data directory on the simulated disk.
    pub dir: PathBuf,
    engine: Option<Engine>,
}

/// How an engine stops before it is reopened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `Engine::shutdown`.
    Clean,
    /// Dropped without shutdown, then `SimStorage::crash_process` (page cache survives).
    ProcessCrash,
    /// Dropped without shutdown, then `SimStorage::power_cut` (unsynced bytes torn at random).
    PowerCut,
    /// Dropped without shutdown, then `SimStorage::power_cut_drop_unsynced`.
    PowerCutDropUnsynced,
}

impl SimHarness {
    /// A fresh disk from `seed` and an engine on it.
    pub fn new(seed: u64, config: Config) -> TestResult<SimHarness> {
        let mut h = SimHarness {
            sim: SimStorage::new(seed),
            clock: ManualClock::new(START_MS),
            config,
            dir: PathBuf::from("/kairos"),
            engine: None,
        };
        h.engine = Some(h.open()?);
        Ok(h)
    }

    /// Opens another engine on the same directory (the current one, if any, still runs), on a
    /// [`SimStorage::process`] view: once [`SimHarness::stop`] cuts the power or crashes the
    /// process, nothing a thread of that engine still does reaches the disk image.
    pub fn open(&self) -> Result<Engine, OpenError> {
        Engine::open_with(
            &self.dir,
            self.config.clone(),
            Arc::new(self.sim.process()),
            Arc::new(self.clock.clone()),
        )
    }

    /// The running engine.
    pub fn engine(&self) -> &Engine {
        self.engine
            .as_ref()
            .expect("SimHarness has no running engine (stop without restart?)")
    }

    /// Stops the engine as `how` says, without reopening.
    pub fn stop(&mut self, how: Stop) -> TestResult {
        let Some(engine) = self.engine.take() else {
            return Ok(());
        };
        match how {
            Stop::Clean => {
                engine.shutdown()?;
                drop(engine);
            }
            Stop::ProcessCrash => {
                drop(engine);
                self.sim.crash_process();
            }
            Stop::PowerCut => {
                drop(engine);
                self.sim.power_cut();
            }
            Stop::PowerCutDropUnsynced => {
                drop(engine);
                self.sim.power_cut_drop_unsynced();
            }
        }
        Ok(())
    }

    /// Opens the engine again after [`SimHarness::stop`].
    pub fn start(&mut self) -> TestResult {
        assert!(self.engine.is_none(), "start while an engine runs");
        self.engine = Some(self.open()?);
        Ok(())
    }

    /// Stops as `how` says and opens again.
    pub fn restart(&mut self, how: Stop) -> TestResult {
        self.stop(how)?;
        self.start()
    }

    /// Advances the clock by `by` and returns what fell due.
    pub fn advance(&self, by: Duration) -> TestResult<Vec<Delivery>> {
        advance(&self.clock, self.engine(), by)
    }

    /// The log directory on the simulated disk.
    pub fn wal_dir(&self) -> PathBuf {
        self.dir.join("wal")
    }

    /// Segment files of the log, in order.
    pub fn segments(&self) -> TestResult<Vec<PathBuf>> {
        let dir = self.wal_dir();
        Ok(self
            .sim
            .list(&dir)?
            .into_iter()
            .filter(|n| n.ends_with(SEGMENT_SUFFIX))
            .map(|n| dir.join(n))
            .collect())
    }
}

/// Segment files (`*.seg`) of the log in `wal_dir` on the real file system, in order.
pub fn fs_segments(wal_dir: &Path) -> TestResult<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(wal_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(SEGMENT_SUFFIX))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The first LSN a segment file name records (`{seq:016x}-{first_lsn:016x}.seg`).
pub fn first_lsn_of(segment: &Path) -> TestResult<u64> {
    let name = segment
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("segment name")?;
    let hex = name
        .strip_suffix(SEGMENT_SUFFIX)
        .and_then(|n| n.split('-').nth(1))
        .ok_or_else(|| format!("unexpected segment name {name}"))?;
    Ok(u64::from_str_radix(hex, 16)?)
}

/// One frame found in a segment image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameAt {
    /// Byte offset of its header in the segment file.
    pub offset: u64,
    /// Header plus body, in bytes.
    pub bytes: u64,
    /// The `kind` byte (1 = DATA, 2 = SEAL, 3 = CLOSE, 4 = MARK).
    pub kind: u8,
    /// Records in it (0 for control frames).
    pub record_count: u32,
    /// LSN of its first record (for control frames: the next LSN).
    pub first_lsn: u64,
}

/// Frame kind byte of a DATA frame (one append).
pub const FRAME_KIND_DATA: u8 = 1;

/// Walks the frames of a segment image, stopping at the end or at the first header that does
/// not fit. No CRC checks: the tests use it on images they have just read from a healthy log.
pub fn frames(segment: &[u8]) -> Vec<FrameAt> {
    let mut out = Vec::new();
    let mut at = SEGMENT_FRAMES_OFFSET;
    while at + FRAME_HEADER_BYTES <= segment.len() {
        let h = FrameHeader::parse(&segment[at..]);
        let bytes = FRAME_HEADER_BYTES + h.body_bytes as usize;
        if h.kind == 0 || at + bytes > segment.len() {
            break;
        }
        out.push(FrameAt {
            offset: at as u64,
            bytes: bytes as u64,
            kind: h.kind,
            record_count: h.record_count,
            first_lsn: h.first_lsn,
        });
        at += bytes;
    }
    out
}

/// The last DATA frame of a segment image.
pub fn last_data_frame(segment: &[u8]) -> Option<FrameAt> {
    frames(segment)
        .into_iter()
        .rev()
        .find(|f| f.kind == FRAME_KIND_DATA)
}

/// A small deterministic generator (SplitMix64) for test data that must not depend on a
/// crate's RNG stream staying stable across versions.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// `true` with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }
}

/// Waits (bounded: a minute) until `done` holds, for work a background
/// thread does on its own (the checkpointer).
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> TestResult {
    let started = std::time::Instant::now();
    while !done() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            return Err(format!("gave up waiting: {what}").into());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Ok(())
}

/// The one minimal executor for the async calls (in `kairos::fuzzing`, shared with the fuzz bodies).
#[allow(unused_imports)]
pub use kairos::fuzzing::{block_on, block_on_counted};
