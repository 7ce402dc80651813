//! Memory of a move out of memory whose entries must be read back (a
//! payload was replaced by a reschedule after the copy began): it reads
//! them about a piece (8 MiB) at a time, never a whole apply batch of
//! large payloads at once. This test binary counts the largest single
//! allocation of the checkpoint's thread after the new overflow file is
//! named (the allocation probe of the fuzz targets, compiled here by path;
//! the simulated storage's own copy of the file, grown while it is written,
//! is left out). (Found by a reviewing helper: a batch of 16 384 moves was
//! read whole.)

mod common;

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod alloc_probe;

use alloc_probe::{largest_allocation_during, LargestAllocation};
use common::far::{at, cfg, due, key};
use common::gate::{Gate, GateStorage};
use common::{TestResult, START_MS};
use kairos::{Due, Engine, ManualClock};
use kairos_wal::storage::{LockGuard, OpenMode, Storage, StorageFile};
use kairos_wal::SimStorage;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// [`GateStorage`] whose renames of overflow files restart the calling
/// thread's count of its largest allocation (after the held rename of the
/// new overflow file, the checkpoint's thread counts what applying the move
/// and writing the checkpoint allocate).
#[derive(Debug, Clone)]
struct Restart(GateStorage);

impl Storage for Restart {
    fn allows_timed_io(&self) -> bool {
        self.0.allows_timed_io()
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.0.create_dir_all(path)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        self.0.open(path, mode)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.0.list(dir)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.0.exists(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let renamed = self.0.rename(from, to);
        if from.starts_with("/kairos/overflow") {
            largest_allocation_during(|| {});
        }
        renamed
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.0.remove_file(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.0.sync_dir(path)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn LockGuard>> {
        self.0.lock(path)
    }
    fn random_id(&self) -> io::Result<[u8; 16]> {
        self.0.random_id()
    }
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

#[test]
fn a_read_back_after_a_replaced_payload_holds_about_a_piece() -> TestResult {
    for replace in [false, true] {
        let gate = Arc::new(Gate::default());
        let storage = Restart(GateStorage {
            inner: SimStorage::new(7),
            gate: Arc::clone(&gate),
        });
        let clock = ManualClock::new(START_MS);
        // No move before the checkpoint's: 48 MiB of far tasks stay under
        // `relocate_far_bytes` (the 16 MiB default would let the background
        // thread move them first, and the gate would wait for a rename
        // that never comes).
        let mut c = cfg();
        c.relocate_far_bytes = 64 << 20;
        let engine = Engine::open_with("/kairos", c, Arc::new(storage), Arc::new(clock))?;
        // 96 far tasks of 512 KiB: 48 MiB in one apply batch.
        let payload = vec![b'p'; 512 << 10];
        for i in 0..96 {
            engine.schedule(&key(i), at(due(i)), &payload)?;
        }
        engine.schedule_after(b"near", Duration::from_secs(1), b"a")?;
        gate.arm_rename(Path::new("/kairos/overflow"));
        let largest = std::thread::scope(|s| -> TestResult<usize> {
            let ckpt = s.spawn(|| {
                let mut result = None;
                let largest = largest_allocation_during(|| result = Some(engine.checkpoint()));
                (largest, result)
            });
            gate.wait_hit();
            if replace {
                // A payload replaced anywhere: the move reads its entries back.
                engine.reschedule(b"near", Due::After(Duration::from_secs(2)), Some(b"b"))?;
            }
            gate.release();
            let (largest, result) = ckpt.join().map_err(|_| "checkpoint thread panicked")?;
            result.ok_or("no checkpoint")??;
            Ok(largest)
        })?;
        assert_eq!(engine.stats().far, 96, "{:?}", engine.stats());
        eprintln!("replace {replace}: largest allocation {largest} bytes");
        assert!(
            largest <= 24 << 20,
            "replace {replace}: applying the move made a {largest}-byte allocation (pieces are 8 MiB)"
        );
    }
    Ok(())
}
