//! Payloads on disk: reading a task's payload back from its overflow file
//! (`crate::overflow`) when it is needed, and the prefetcher that reads the
//! payloads coming due back into memory ahead of their due time.

use super::{Core, Shared};
use crate::overflow;
use crate::task::Task;

impl Shared {
    /// The payload of `task` (key `key`), whose payload is not in memory,
    /// read from its overflow file. `Err` describes a read failure or
    /// damage (file and offset).
    pub(super) fn read_payload(&self, task: &Task, key: &[u8]) -> Result<Box<[u8]>, String> {
        match task.bytes.on_disk() {
            Some((file, offset)) => self.read_payload_at(file, offset, task.id.0, key),
            None => Ok(Box::default()),
        }
    }

    /// Reads the payload of task `id` (key `key`) from overflow file `file`
    /// at `offset`.
    pub(super) fn read_payload_at(
        &self,
        file: u32,
        offset: u64,
        id: u64,
        key: &[u8],
    ) -> Result<Box<[u8]>, String> {
        let Some(disk) = &self.disk else {
            return Ok(Box::default());
        };
        disk.overflow_file(file)
            .and_then(|f| f.read(offset, id, Some(key)))
            .map(|e| e.payload)
            .map_err(|e| format!("cannot read the payload of task {id}: {e}"))
    }

    /// Brings the payload of the task in `slot` into memory if it is on
    /// disk (one read). `Err`: the read failed or the entry is damaged —
    /// durable data is unreadable, and the caller poisons the engine.
    pub(super) fn load_payload_locked(&self, core: &mut Core, slot: u32) -> Result<(), String> {
        let Some(task) = core.tasks.get(slot) else {
            return Ok(());
        };
        if task.bytes.on_disk().is_none() {
            return Ok(());
        }
        let key: Box<[u8]> = core.payloads.key(&task.bytes).into();
        let payload = self.read_payload(task, &key)?;
        if let Some(task) = core.tasks.get_mut(slot) {
            let new_ref = core.payloads.put(&key, &payload);
            let old = std::mem::replace(&mut task.bytes, new_ref);
            core.release_bytes(slot, old);
            core.payloads_read_back += 1;
        }
        Ok(())
    }
}

/// Bytes the prefetcher reads from an overflow file at a time.
const PREFETCH_CHUNK_BYTES: usize = 1024 * 1024;

impl Shared {
    /// The prefetcher: every quarter of `Config::payload_window` (real time,
    /// at least 10 ms), reads from each overflow file, sequentially from
    /// where it stopped last, the entries due within the window, and puts the
    /// payloads of tasks that still refer to them back in memory — so that
    /// the consumer receiving a task does not wait on disk. Entries of tasks
    /// cancelled, finished or rescheduled with a new payload are skipped; a
    /// task rescheduled earlier than its place in the file is read by its
    /// consumer instead. A read failure is logged and that file is no longer
    /// prefetched (the consumer's read reports the damage).
    pub(crate) fn prefetch_loop(&self) {
        let Some(window) = self.config.payload_window else {
            return;
        };
        let Some(disk) = &self.disk else {
            return;
        };
        let period = (window / 4).max(std::time::Duration::from_millis(10));
        let mut cursors: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        loop {
            let files: Vec<u32> = {
                let mut core = self.core.lock();
                if core.stop {
                    return;
                }
                self.prefetch_cv.wait_for(&mut core, period);
                if core.stop {
                    return;
                }
                core = self.promote_far(core);
                if core.stop {
                    return;
                }
                core.overflow_files.keys().copied().collect()
            };
            cursors.retain(|f, _| files.contains(f));
            let until = super::wall_ms(self.now()).saturating_add(window.as_millis() as u64);
            for file in files {
                let cursor = cursors.entry(file).or_insert(overflow::HEADER_BYTES as u64);
                if *cursor == u64::MAX {
                    continue;
                }
                let path = disk.overflow_dir().join(overflow::file_name(file));
                loop {
                    match overflow::read_due(
                        disk.storage.as_ref(),
                        &path,
                        *cursor,
                        until,
                        PREFETCH_CHUNK_BYTES,
                    ) {
                        Ok((entries, next)) => {
                            let done = entries.is_empty() || next == *cursor;
                            *cursor = next;
                            self.take_prefetched(file, entries);
                            if done {
                                break;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%error, "prefetch stopped for this overflow file");
                            *cursor = u64::MAX;
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Puts prefetched payloads in memory for the tasks that still refer to
    /// their entries.
    fn take_prefetched(&self, file: u32, entries: Vec<(u64, overflow::Entry)>) {
        if entries.is_empty() {
            return;
        }
        let mut core = self.core.lock();
        let c = &mut *core;
        for (offset, entry) in entries {
            let tag = c.key_tag(&entry.key);
            let Some(slot) = c.find_slot(tag, &entry.key) else {
                continue;
            };
            let Some(task) = c.tasks.get(slot) else {
                continue;
            };
            if task.id.0 != entry.task_id || task.bytes.on_disk() != Some((file, offset)) {
                continue;
            }
            if let Some(task) = c.tasks.get_mut(slot) {
                let new_ref = c.payloads.put(&entry.key, &entry.payload);
                let old = std::mem::replace(&mut task.bytes, new_ref);
                c.release_bytes(slot, old);
                c.payloads_read_back += 1;
            }
        }
    }
}
