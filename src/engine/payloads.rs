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
            .map_err(|e| super::far::unreadable(&format!("the payload of task {id}"), &e))
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

impl Core {
    /// The offsets after `offset` in overflow file `file`, ascending, of
    /// the entries tasks still need: the payloads of tasks in memory
    /// (`bytes.on_disk()`) and far tasks' entries (whose payload the
    /// promotion leaves there). Where the prefetcher reads on past a
    /// damaged entry: no task refers to the entries between, nor will one
    /// (new references go to new files; a far task promoted keeps its
    /// entry's place, counted here) — so the list, taken once, stays good
    /// for the rest of a round: an entry in it no longer needed (its task
    /// finished, or its payload read back since) is only read for nothing.
    /// Dead letters are not looked at: their payloads are always in memory
    /// (read back at open, or when the task is dead-lettered).
    ///
    /// O(tasks + far tasks) — a scan of the slab (none when no task's
    /// payload is in `file`) and of the far index (none when no far task's
    /// entry is) — under the engine's lock: made only when the prefetcher
    /// meets damage, once per damaged file and round (not per damaged
    /// entry: [`Shared::prefetch_files`] keeps the list).
    pub(super) fn needed_entries_after(&mut self, file: u32, offset: u64) -> Vec<u64> {
        #[cfg(test)]
        {
            self.needed_entry_scans += 1;
        }
        let mut needed = Vec::new();
        if self.payloads.live_in_file(file) > 0 {
            needed.extend(
                self.tasks
                    .iter()
                    .filter_map(|t| t.bytes.on_disk())
                    .filter(|&(f, at)| f == file && at > offset)
                    .map(|(_, at)| at),
            );
        }
        if self.far.live_in_file(file) > 0 {
            needed.extend(
                self.far
                    .iter()
                    .map(|e| crate::far::unpack_loc(e.loc))
                    .filter(|&(f, at)| f == file && at > offset)
                    .map(|(_, at)| at),
            );
        }
        needed.sort_unstable();
        needed.dedup();
        needed
    }
}

/// Bytes the prefetcher reads first from an overflow file, at its cursor:
/// a page, which holds the entry there unless it is larger (that entry is
/// then read whole). Most rounds find it not due (overflow files hold
/// tasks due days or years out): this is all they read of the file, once —
/// its due time is kept ([`FileCursor::next_due_ms`]), and the file is not
/// read again until the window reaches it.
pub(super) const PREFETCH_FIRST_CHUNK_BYTES: usize = 4 * 1024;

/// The most bytes the prefetcher reads from an overflow file at a time:
/// it doubles its reads from [`PREFETCH_FIRST_CHUNK_BYTES`] up to this
/// while every entry read is due.
const PREFETCH_CHUNK_BYTES: usize = 1024 * 1024;

/// The most rounds the prefetcher lets pass before it reads again an
/// overflow file whose read failed: after the `n`-th failure in a row it
/// tries again `2^(n-1)` rounds later, at most this many (4 payload
/// windows).
pub(super) const PREFETCH_RETRY_ROUNDS_MAX: u64 = 16;

/// Rounds after the `failures`-th failed read in a row of a file before
/// the prefetcher reads it again: 1, 2, 4, … up to
/// [`PREFETCH_RETRY_ROUNDS_MAX`].
pub(super) fn prefetch_retry_rounds(failures: u32) -> u64 {
    1u64.checked_shl(failures.saturating_sub(1))
        .unwrap_or(u64::MAX)
        .min(PREFETCH_RETRY_ROUNDS_MAX)
}

/// Where the prefetcher stands in one overflow file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileCursor {
    /// Where the next read starts: the first entry not taken yet.
    pub offset: u64,
    /// The due time (UTC ms, as the file has it: its sort key) of the entry
    /// at `offset`, once a read found it (read whole, its CRC checked):
    /// `None` before, `Some(u64::MAX)` past the file's last entry. Files are
    /// never modified: the file is not read again while this is beyond the
    /// window.
    pub next_due_ms: Option<u64>,
    /// Reads of the file that failed in a row (I/O errors); 0 once one
    /// succeeds.
    pub failures: u32,
    /// The round from which the file is read again (after a failure).
    pub retry_round: u64,
    /// An entry is damaged (checksum, format) and no task needs an entry
    /// after it ([`Core::needed_entries_after`]): the file is not read
    /// again while the engine runs. (With one needed after it, the cursor
    /// goes on at that entry instead.)
    pub damaged: bool,
}

impl FileCursor {
    /// Whether the file holds nothing due by `until` from the cursor on, as
    /// far as the reads so far tell (nothing is known of a file not read
    /// yet).
    fn nothing_due_by(&self, until: u64) -> bool {
        self.next_due_ms.is_some_and(|due| due > until)
    }
}

impl Default for FileCursor {
    fn default() -> Self {
        FileCursor {
            offset: overflow::HEADER_BYTES as u64,
            next_due_ms: None,
            failures: 0,
            retry_round: 0,
            damaged: false,
        }
    }
}

/// The prefetcher's state from one round to the next
/// ([`Shared::prefetch_loop`]).
#[derive(Debug, Default)]
pub(super) struct Prefetcher {
    /// Rounds begun so far.
    pub round: u64,
    /// Per overflow file in use, where its reads stand.
    pub cursors: std::collections::HashMap<u32, FileCursor>,
}

impl Shared {
    /// The prefetcher: every quarter of `Config::payload_window` (real time,
    /// at least 10 ms), promotes the far tasks coming within the far span,
    /// then reads from each overflow file, sequentially from where it
    /// stopped last, the entries due within the window, and puts the
    /// payloads of tasks that still refer to them back in memory — so that
    /// the consumer receiving a task does not wait on disk. Entries of tasks
    /// cancelled, finished or rescheduled with a new payload are skipped; a
    /// task rescheduled earlier than its place in the file is read by its
    /// consumer instead. A file whose next entry is not due within the
    /// window costs nothing once a round has read that entry (see
    /// [`Shared::prefetch_files`], also for what a failed read does).
    pub(crate) fn prefetch_loop(&self) {
        let Some(window) = self.config.payload_window else {
            return;
        };
        let Some(disk) = &self.disk else {
            return;
        };
        let period = (window / 4).max(std::time::Duration::from_millis(10));
        let mut prefetcher = Prefetcher::default();
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
            let until = super::wall_ms(self.now()).saturating_add(window.as_millis() as u64);
            self.prefetch_files(disk, &mut prefetcher, &files, until);
        }
    }

    /// One round of the prefetcher: reads from each of `files` (the
    /// overflow files in use when the round began) the entries due by
    /// `until`, from where the last round stopped, and puts the payloads
    /// of the tasks that still refer to them in memory.
    ///
    /// What a round reads of a file: nothing (not even an open) if an
    /// earlier round found the entry at its cursor due after `until` — the
    /// common case, overflow files holding tasks due days to years out; the
    /// first time, [`PREFETCH_FIRST_CHUNK_BYTES`] at its cursor (or the
    /// entry there whole, if larger) to find that out; and while entries
    /// are due, reads twice as large each time, up to
    /// [`PREFETCH_CHUNK_BYTES`], ending at the first entry not due (its
    /// due time kept). So a round in which nothing is due reads at most a
    /// first piece of each file not read before, and O(files) work beside.
    ///
    /// A file whose read fails: if it is no longer in use (a checkpoint
    /// removed it since the round began — its entries were moved to
    /// another file or belong to no live task), it is dropped quietly; if
    /// an entry is damaged (checksum, format), a warning naming the file
    /// and the offset, and the reading goes on, in the same round, at the
    /// next entry after it that a task still needs
    /// ([`Core::needed_entries_after`]: an O(tasks) scan under the
    /// engine's lock, made only on damage, once per file and round) —
    /// entries between are no task's
    /// — or, when there is none, the file is not read again while the
    /// engine runs. The damaged entry is gone past even when a task needs
    /// it: the prefetcher poisons nothing; the consumer receiving that task
    /// reads the entry itself and reports the damage. Any other failure
    /// (I/O) is a warning, and the file is read again from where it
    /// stopped after a backoff ([`prefetch_retry_rounds`]), so that its
    /// payloads still come back ahead of their due time once the fault
    /// clears.
    pub(super) fn prefetch_files(
        &self,
        disk: &super::checkpointing::Disk,
        prefetcher: &mut Prefetcher,
        files: &[u32],
        until: u64,
    ) {
        prefetcher.round += 1;
        let round = prefetcher.round;
        // The cursors of files no longer in use go (O(files), not a scan of
        // `files` per cursor).
        let listed: std::collections::HashSet<u32> = files.iter().copied().collect();
        prefetcher.cursors.retain(|f, _| listed.contains(f));
        for &file in files {
            let cursor = prefetcher.cursors.entry(file).or_default();
            if cursor.damaged || round < cursor.retry_round || cursor.nothing_due_by(until) {
                continue;
            }
            // Read until done, going past each damaged entry (every skip
            // moves the cursor forward: this ends). The entries tasks need
            // after the first damage, listed once for the round.
            let mut needed: Option<Vec<u64>> = None;
            let error = loop {
                let error = match self.prefetch_file(disk, file, cursor, until) {
                    Ok(()) => {
                        cursor.failures = 0;
                        break None;
                    }
                    Err(error) => error,
                };
                let next = {
                    let mut core = self.core.lock();
                    if !core.overflow_files.contains_key(&file) {
                        break Some((error, true));
                    }
                    match &error {
                        overflow::OverflowReadError::Corrupt { offset, .. } => {
                            let damaged = (*offset).max(cursor.offset);
                            let needed = needed
                                .get_or_insert_with(|| core.needed_entries_after(file, damaged));
                            needed
                                .get(needed.partition_point(|&at| at <= damaged))
                                .copied()
                        }
                        overflow::OverflowReadError::Io { .. } => None,
                    }
                };
                match (&error, next) {
                    (overflow::OverflowReadError::Corrupt { offset, .. }, Some(next)) => {
                        tracing::warn!(
                            file = %overflow::file_name(file),
                            offset,
                            %error,
                            "prefetch goes past a damaged overflow entry, to the next entry \
                             a task needs"
                        );
                        cursor.offset = next;
                        cursor.next_due_ms = None;
                    }
                    _ => break Some((error, false)),
                }
            };
            let Some((error, removed)) = error else {
                continue;
            };
            if removed {
                // Removed since the round listed it: nothing of it is due.
                tracing::debug!(%error, "overflow file removed while being prefetched");
                prefetcher.cursors.remove(&file);
                continue;
            }
            match error {
                overflow::OverflowReadError::Corrupt { offset, .. } => {
                    tracing::warn!(
                        file = %overflow::file_name(file),
                        offset,
                        %error,
                        "prefetch stopped for this damaged overflow file: no task needs an \
                         entry after the damaged one"
                    );
                    cursor.damaged = true;
                }
                overflow::OverflowReadError::Io { .. } => {
                    cursor.failures = cursor.failures.saturating_add(1);
                    let rounds = prefetch_retry_rounds(cursor.failures);
                    cursor.retry_round = round.saturating_add(rounds);
                    tracing::warn!(
                        %error,
                        failures = cursor.failures,
                        retry_in_rounds = rounds,
                        "prefetch of an overflow file failed; it is read again later"
                    );
                }
            }
        }
    }

    /// Reads the entries of overflow file `file` due by `until` from
    /// `cursor.offset` on, in growing chunks ([`PREFETCH_FIRST_CHUNK_BYTES`]
    /// to [`PREFETCH_CHUNK_BYTES`]), and puts their payloads in memory
    /// ([`Shared::take_prefetched`]); the cursor follows the entries taken
    /// (with the due time of the entry it stops at), so a read that fails
    /// midway resumes after them. Through the
    /// descriptor the engine keeps open for the file, if any
    /// ([`super::checkpointing::Disk::kept_overflow_file`]), else one opened
    /// for this read and closed after it (not kept: which files stay open
    /// is up to the single reads, far cancels, that they save most).
    fn prefetch_file(
        &self,
        disk: &super::checkpointing::Disk,
        file: u32,
        cursor: &mut FileCursor,
        until: u64,
    ) -> Result<(), overflow::OverflowReadError> {
        let handle = match disk.kept_overflow_file(file) {
            Some(handle) => handle,
            None => {
                let path = disk.overflow_dir().join(overflow::file_name(file));
                std::sync::Arc::new(overflow::EntryFile::open(disk.storage.as_ref(), &path)?)
            }
        };
        loop {
            let read = handle.read_due(
                cursor.offset,
                until,
                PREFETCH_FIRST_CHUNK_BYTES,
                PREFETCH_CHUNK_BYTES,
            )?;
            let done = read.entries.is_empty() || read.next == cursor.offset;
            cursor.offset = read.next;
            cursor.next_due_ms = Some(read.next_due_ms.unwrap_or(u64::MAX));
            self.take_prefetched(file, read.entries);
            // Not stopped by an entry due later (nor at the end): stopped
            // at its entry count, the next entry due; read on.
            if done || cursor.nothing_due_by(until) {
                return Ok(());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::counting::Counting;
    use crate::{Config, Due, Engine, ManualClock};
    use kairos_wal::storage::{FaultKind, FaultOp, FaultPlan, OpenMode, Storage as _};
    use kairos_wal::SimStorage;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    const START_MS: u64 = 1_700_000_000_000;
    const MINUTE_MS: u64 = 60_000;

    /// Counts the `tracing` events at WARN and at DEBUG of the thread it is
    /// the default subscriber of.
    #[derive(Default)]
    struct Events {
        warn: AtomicUsize,
        debug: AtomicUsize,
    }

    impl tracing::Subscriber for Events {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            match *event.metadata().level() {
                tracing::Level::WARN => self.warn.fetch_add(1, Ordering::SeqCst),
                tracing::Level::DEBUG => self.debug.fetch_add(1, Ordering::SeqCst),
                _ => 0,
            };
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// [`Shared::prefetch_files`] run once on this thread over `files`,
    /// with the entries due within a minute of now; the WARN and DEBUG
    /// events it logged.
    fn round(engine: &Engine, p: &mut Prefetcher, files: &[u32]) -> (usize, usize) {
        let shared = &engine.shared;
        let disk = shared.disk.as_ref().expect("on disk");
        let until = super::super::wall_ms(shared.now()) + MINUTE_MS;
        let events = Arc::new(Events::default());
        tracing::subscriber::with_default(Arc::clone(&events), || {
            shared.prefetch_files(disk, p, files, until);
        });
        (
            events.warn.load(Ordering::SeqCst),
            events.debug.load(Ordering::SeqCst),
        )
    }

    /// An engine on simulated storage with a one-minute payload window,
    /// no prefetch thread (the test runs the rounds), no background
    /// checkpoint and no far tasks: a checkpoint moves the payloads of
    /// tasks due after the window to an overflow file, the tasks stay in
    /// the wheel.
    fn engine(sim: &SimStorage, clock: &ManualClock) -> Engine {
        let c = Config {
            payload_window: Some(Duration::from_millis(MINUTE_MS)),
            payload_prefetch: false,
            resident_window: None,
            relocate_far_tasks: None,
            checkpoint_interval: None,
            checkpoint_log_bytes: None,
            ..Config::default()
        };
        Engine::open_with("/k", c, Arc::new(sim.clone()), Arc::new(clock.clone())).expect("open")
    }

    fn payload(i: u64) -> Vec<u8> {
        format!("payload of task {i:0>40}").into_bytes()
    }

    /// Schedules tasks `0..n`, task `i` due 10 minutes on plus `i` ms, and
    /// moves their payloads to one overflow file; its number.
    fn on_disk(engine: &Engine, n: u64) -> u32 {
        for i in 0..n {
            let due = UNIX_EPOCH + Duration::from_millis(START_MS + 10 * MINUTE_MS + i);
            engine
                .schedule(format!("k{i}").as_bytes(), Due::At(due), &payload(i))
                .expect("schedule");
        }
        assert_eq!(engine.checkpoint().expect("checkpoint").payloads_moved, n);
        assert_eq!(engine.stats().payloads_on_disk, n as usize);
        let files = overflow_file_numbers(engine);
        assert_eq!(files.len(), 1);
        files[0]
    }

    /// The numbers of the engine's overflow files, in order.
    fn overflow_file_numbers(engine: &Engine) -> Vec<u32> {
        engine
            .shared
            .core
            .lock()
            .overflow_files
            .keys()
            .copied()
            .collect()
    }

    /// An engine on a fresh simulated disk (`seed`) with tasks `0..n` in
    /// one overflow file ([`on_disk`]), the clock moved until they are due
    /// within the payload window: what a prefetch round reads next.
    fn due_within_window(seed: u64, n: u64) -> (SimStorage, ManualClock, Engine, u32) {
        let sim = SimStorage::new(seed);
        let clock = ManualClock::new(START_MS);
        let engine = engine(&sim, &clock);
        let file = on_disk(&engine, n);
        clock.advance(Duration::from_millis(9 * MINUTE_MS + 30_000));
        engine.run_until_idle();
        (sim, clock, engine, file)
    }

    const DAY_MS: u64 = 24 * 60 * MINUTE_MS;
    /// Far tasks per overflow file in [`far_files`].
    const FAR_PER_FILE: u64 = 200;
    /// Bytes of each of their entries: the fixed part, a 6-byte key and a
    /// [`payload`].
    const FAR_ENTRY_BYTES: u64 = (overflow::ENTRY_FIXED_BYTES + 6 + 56) as u64;

    /// An engine on `storage` with the defaults' far tasks (beyond a minute
    /// from now, wholly on disk after a checkpoint), a one-minute payload
    /// window, and no prefetch thread, background checkpoint or move; and
    /// `files` overflow files, one per checkpoint, file `f` holding
    /// [`FAR_PER_FILE`] far tasks due `f + 1` days on (plus their index in
    /// ms). The files' numbers, in order.
    fn far_files(storage: &Counting, clock: &ManualClock, files: u64) -> (Engine, Vec<u32>) {
        let c = Config {
            payload_window: Some(Duration::from_millis(MINUTE_MS)),
            payload_prefetch: false,
            relocate_far_tasks: None,
            checkpoint_interval: None,
            checkpoint_log_bytes: None,
            ..Config::default()
        };
        let engine = Engine::open_with("/k", c, Arc::new(storage.clone()), Arc::new(clock.clone()))
            .expect("open");
        for f in 0..files {
            for i in 0..FAR_PER_FILE {
                let due = START_MS + (f + 1) * DAY_MS + i;
                engine
                    .schedule(
                        format!("f{f}-{i:03}").as_bytes(),
                        Due::At(UNIX_EPOCH + Duration::from_millis(due)),
                        &payload(i),
                    )
                    .expect("schedule");
            }
            engine.checkpoint().expect("checkpoint");
            assert_eq!(engine.stats().far as u64, (f + 1) * FAR_PER_FILE);
        }
        let numbers = overflow_file_numbers(&engine);
        assert_eq!(numbers.len() as u64, files);
        (engine, numbers)
    }

    /// A prefetch round in which nothing is due within the window reads
    /// little of each overflow file: the first round one first piece of it
    /// (4 KiB, the entry there found not due), later rounds nothing at all,
    /// not even an open — until the window reaches that entry. (Before,
    /// every round read up to 1 MiB of every file: here each file whole,
    /// 18 400 bytes, every round.)
    #[test]
    fn an_idle_round_reads_a_first_piece_of_each_file_then_nothing() {
        const FILES: u64 = 4;
        const FIRST_PIECE: u64 = PREFETCH_FIRST_CHUNK_BYTES as u64;
        let storage = Counting::new(SimStorage::new(66));
        let clock = ManualClock::new(START_MS);
        let (engine, files) = far_files(&storage, &clock, FILES);
        let disk = engine.shared.disk.as_ref().expect("on disk");
        for &file in &files {
            let path = disk.overflow_dir().join(overflow::file_name(file));
            let len = storage.sim.read_file(&path).expect("file").len() as u64;
            assert_eq!(
                len,
                overflow::HEADER_BYTES as u64 + FAR_PER_FILE * FAR_ENTRY_BYTES
            );
            assert!(len > overflow::HEADER_BYTES as u64 + FIRST_PIECE);
        }
        let mut p = Prefetcher::default();
        let before = storage.total();
        assert_eq!(round(&engine, &mut p, &files), (0, 0));
        let after = storage.total();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (FILES, FILES * FIRST_PIECE),
            "opens and bytes read by the first idle round"
        );
        // Later rounds, hours on: nothing is read.
        for _ in 0..8 {
            clock.advance(Duration::from_millis(60 * MINUTE_MS));
            engine.run_until_idle();
            let before = storage.total();
            assert_eq!(round(&engine, &mut p, &files), (0, 0));
            assert_eq!(storage.total(), before, "an idle round read");
        }
        let stats = engine.stats();
        assert_eq!(
            (stats.far as u64, stats.payloads_read_back),
            (FILES * FAR_PER_FILE, 0)
        );
        engine.shutdown().expect("shutdown");
    }

    /// A file skipped while nothing in it was due is read, from where the
    /// last round stopped, once its first entry comes within the window:
    /// every payload of its tasks (promoted, back in the wheel) comes back,
    /// and the other files are not read.
    #[test]
    fn a_skipped_file_is_read_once_its_entries_come_within_the_window() {
        const FILES: u64 = 3;
        let storage = Counting::new(SimStorage::new(67));
        let clock = ManualClock::new(START_MS);
        let (engine, files) = far_files(&storage, &clock, FILES);
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &files), (0, 0));
        // Half a minute before the first file's tasks fall due: promoted
        // (within the far span) and within the payload window.
        clock.advance(Duration::from_millis(DAY_MS - 30_000));
        engine.run_until_idle();
        assert_eq!(engine.stats().far as u64, (FILES - 1) * FAR_PER_FILE);
        let seen: Vec<(u64, u64)> = files.iter().map(|&f| storage.of(f)).collect();
        assert_eq!(round(&engine, &mut p, &files), (0, 0));
        let stats = engine.stats();
        // The far tasks' payloads stay on disk.
        assert_eq!(
            (stats.payloads_on_disk as u64, stats.payloads_read_back),
            ((FILES - 1) * FAR_PER_FILE, FAR_PER_FILE)
        );
        let rest = FAR_PER_FILE * FAR_ENTRY_BYTES;
        let first = storage.of(files[0]);
        assert!(
            first.1 - seen[0].1 >= rest && first.1 - seen[0].1 < 2 * rest,
            "{first:?} {seen:?}"
        );
        for (i, &file) in files.iter().enumerate().skip(1) {
            assert_eq!(storage.of(file), seen[i], "file {file} read");
        }
        // Due: handed out with their payloads, nothing more read.
        clock.advance(Duration::from_millis(30_000 + FAR_PER_FILE));
        engine.run_until_idle();
        let consumer = engine.consumer();
        for i in 0..FAR_PER_FILE {
            let d = consumer.try_recv().expect("due");
            assert_eq!(d.key(), format!("f0-{i:03}").as_bytes());
            assert_eq!(d.payload(), &payload(i)[..]);
            consumer.ack(&d).expect("ack");
        }
        assert_eq!(engine.stats().payloads_read_back, FAR_PER_FILE);
        engine.shutdown().expect("shutdown");
    }

    /// The randomized runs' seeded generator (rand's `StdRng`), with the two
    /// draws they use.
    struct Rng(rand::rngs::StdRng);

    impl Rng {
        fn seeded(seed: u64) -> Rng {
            Rng(rand::SeedableRng::seed_from_u64(seed))
        }
        /// Uniform in `0..n` (0 when `n` is 0).
        fn below(&mut self, n: u64) -> u64 {
            rand::Rng::random_range(&mut self.0, 0..n.max(1))
        }
        fn chance(&mut self, one_in: u64) -> bool {
            self.below(one_in) == 0
        }
    }

    /// The tasks in memory whose payload is still in an overflow file
    /// although the entry there is due by `until`: (key, entry due, file).
    fn due_entries_left_on_disk(engine: &Engine, until: u64) -> Vec<(String, u64, u32)> {
        let shared = &engine.shared;
        let disk = shared.disk.as_ref().expect("on disk");
        let on_disk: Vec<(u64, Box<[u8]>, u32, u64)> = {
            let core = shared.core.lock();
            core.tasks
                .iter()
                .filter_map(|t| {
                    let (file, offset) = t.bytes.on_disk()?;
                    Some((t.id.0, core.payloads.key(&t.bytes).into(), file, offset))
                })
                .collect()
        };
        on_disk
            .into_iter()
            .filter_map(|(id, key, file, offset)| {
                let path = disk.overflow_dir().join(overflow::file_name(file));
                let entry =
                    overflow::read_entry(disk.storage.as_ref(), &path, offset, id, Some(&key))
                        .expect("the entry a task names");
                (entry.due_ms <= until).then(|| {
                    (
                        String::from_utf8_lossy(&key).into_owned(),
                        entry.due_ms,
                        file,
                    )
                })
            })
            .collect()
    }

    /// One randomized run: schedules (payloads of a few bytes to 12 KiB,
    /// so that entries straddle and exceed the first 4 KiB read),
    /// reschedules earlier or later (with a new payload or keeping the one
    /// on disk), cancels, checkpoints (moving payloads to disk, making far
    /// tasks, compacting files half dead), clock moves (forward only unless
    /// `wall_steps`: then also wall-clock steps either way) and prefetch
    /// rounds through one [`Prefetcher`] kept from round to round, as the
    /// prefetch thread keeps it. After each round with the wall clock never
    /// gone back, no task in memory may still have its payload in an
    /// overflow file at an entry due within the window (`until`): its file
    /// was skipped wrongly, or read from a stale cursor. Every delivery
    /// must carry the payload last given to its key.
    fn prefetch_run(seed: u64, wall_steps: bool) -> (u64, u64) {
        let mut rng = Rng::seeded(seed);
        let sim = SimStorage::new(seed);
        let clock = ManualClock::new(START_MS);
        let resident = match seed % 3 {
            0 => Some(Duration::from_millis(MINUTE_MS)),
            1 => Some(Duration::from_millis(10 * MINUTE_MS)),
            _ => None,
        };
        let c = Config {
            payload_window: Some(Duration::from_millis(MINUTE_MS)),
            payload_prefetch: false,
            resident_window: resident,
            relocate_far_tasks: None,
            checkpoint_interval: None,
            checkpoint_log_bytes: None,
            ..Config::default()
        };
        let engine = Engine::open_with("/k", c, Arc::new(sim.clone()), Arc::new(clock.clone()))
            .expect("open");
        let consumer = engine.consumer();
        let mut live: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
        let mut next_key = 0u64;
        let mut p = Prefetcher::default();
        let mut wall_went_back = false;
        let (mut checked, mut delivered) = (0u64, 0u64);
        let pick_payload = |rng: &mut Rng, tag: u64| -> Vec<u8> {
            let len = if rng.chance(4) {
                3_000 + rng.below(9_000)
            } else {
                10 + rng.below(200)
            };
            let mut b = format!("p{tag}-").into_bytes();
            b.resize(len as usize, b'a' + (tag % 26) as u8);
            b
        };
        let pick_due = |rng: &mut Rng, clock: &ManualClock| -> u64 {
            let ahead = match rng.below(4) {
                0 => rng.below(2 * MINUTE_MS),
                1 => rng.below(30 * MINUTE_MS),
                2 => rng.below(6 * 60 * MINUTE_MS),
                _ => rng.below(3 * DAY_MS),
            };
            clock.wall_ms() + 1 + ahead
        };
        for step in 0..300u64 {
            match rng.below(100) {
                0..=29 => {
                    let key = next_key;
                    next_key += 1;
                    let payload = pick_payload(&mut rng, step);
                    let due = pick_due(&mut rng, &clock);
                    engine
                        .schedule(
                            format!("k{key}").as_bytes(),
                            Due::At(UNIX_EPOCH + Duration::from_millis(due)),
                            &payload,
                        )
                        .expect("schedule");
                    live.insert(key, payload);
                }
                30..=44 if !live.is_empty() => {
                    let key = *live
                        .keys()
                        .nth(rng.below(live.len() as u64) as usize)
                        .unwrap();
                    let due = if rng.chance(2) {
                        clock.wall_ms() + 1 + rng.below(5 * MINUTE_MS)
                    } else {
                        pick_due(&mut rng, &clock)
                    };
                    let new = rng.chance(2).then(|| pick_payload(&mut rng, step));
                    match engine.reschedule(
                        format!("k{key}").as_bytes(),
                        Due::At(UNIX_EPOCH + Duration::from_millis(due)),
                        new.as_deref(),
                    ) {
                        Ok(_) => {
                            if let Some(new) = new {
                                live.insert(key, new);
                            }
                        }
                        // Handed out and held: not rescheduled.
                        Err(crate::ScheduleError::InFlight { .. }) => {}
                        Err(e) => panic!("seed {seed}: reschedule: {e}"),
                    }
                }
                45..=54 if !live.is_empty() => {
                    let key = *live
                        .keys()
                        .nth(rng.below(live.len() as u64) as usize)
                        .unwrap();
                    if engine
                        .cancel(format!("k{key}").as_bytes())
                        .expect("cancel")
                        .is_cancelled()
                    {
                        live.remove(&key);
                    }
                }
                55..=66 => {
                    engine.checkpoint().expect("checkpoint");
                }
                67..=84 => {
                    let by = match rng.below(3) {
                        0 => rng.below(20_000),
                        1 => rng.below(20 * MINUTE_MS),
                        _ => rng.below(12 * 60 * MINUTE_MS),
                    };
                    clock.advance(Duration::from_millis(by + 1));
                    if wall_steps && rng.chance(3) {
                        let delta = rng.below(4 * 60 * MINUTE_MS) as i64;
                        let back = rng.chance(2);
                        clock.step_wall(if back { -delta } else { delta });
                        wall_went_back |= back && delta > 0;
                    }
                    engine.run_until_idle();
                }
                _ => {
                    let files = overflow_file_numbers(&engine);
                    let until = super::super::wall_ms(engine.shared.now()) + MINUTE_MS;
                    let (warnings, _) = round(&engine, &mut p, &files);
                    assert_eq!(warnings, 0, "seed {seed} step {step}: a warning");
                    if !wall_went_back {
                        let left = due_entries_left_on_disk(&engine, until);
                        assert!(
                            left.is_empty(),
                            "seed {seed} step {step}: payloads due by {until} left on disk \
                             after a prefetch round (key, entry due, file): {left:?}; cursors \
                             {:?}",
                            p.cursors
                        );
                        checked += 1;
                    }
                }
            }
            // Deliveries: the payload last given to the key.
            while let Ok(d) = consumer.try_recv() {
                let key: u64 = std::str::from_utf8(&d.key()[1..])
                    .expect("utf-8")
                    .parse()
                    .expect("key");
                let want = live.remove(&key).expect("a live task");
                assert_eq!(d.payload(), &want[..], "seed {seed}: payload of k{key}");
                consumer.ack(&d).expect("ack");
                delivered += 1;
            }
        }
        engine.shutdown().expect("shutdown");
        (checked, delivered)
    }

    /// [`prefetch_run`] over many seeds, the wall clock moving forward
    /// only: every prefetch round leaves no payload due within the window
    /// on disk.
    #[test]
    fn randomized_rounds_leave_no_payload_due_within_the_window_on_disk() {
        let (mut checked, mut delivered) = (0, 0);
        for seed in 0..60 {
            let (c, d) = prefetch_run(seed, false);
            checked += c;
            delivered += d;
        }
        assert!(checked > 500 && delivered > 1000, "{checked} {delivered}");
    }

    /// The same with wall-clock steps either way: rounds are checked only
    /// while the wall clock has not gone back, deliveries always.
    #[test]
    fn randomized_rounds_with_wall_steps_deliver_the_right_payloads() {
        let mut delivered = 0;
        for seed in 1000..1030 {
            delivered += prefetch_run(seed, true).1;
        }
        assert!(delivered > 500, "{delivered}");
    }

    /// A round drops the cursors of the files it does not list (no longer
    /// in use) and keeps the others'.
    #[test]
    fn a_round_drops_the_cursors_of_files_it_does_not_list() {
        let storage = Counting::new(SimStorage::new(68));
        let clock = ManualClock::new(START_MS);
        let (engine, files) = far_files(&storage, &clock, 3);
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &files), (0, 0));
        let kept = p.cursors[&files[2]];
        assert_eq!(round(&engine, &mut p, &[files[2], files[0]]), (0, 0));
        let mut left: Vec<u32> = p.cursors.keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [files[0], files[2]]);
        assert_eq!(p.cursors[&files[2]], kept);
        assert_eq!(round(&engine, &mut p, &[]), (0, 0));
        assert!(p.cursors.is_empty());
        engine.shutdown().expect("shutdown");
    }

    #[test]
    fn retry_rounds_double_up_to_the_cap() {
        let rounds: Vec<u64> = (1..=7).map(prefetch_retry_rounds).collect();
        assert_eq!(rounds, [1, 2, 4, 8, 16, 16, 16]);
        assert_eq!(prefetch_retry_rounds(u32::MAX), PREFETCH_RETRY_ROUNDS_MAX);
    }

    /// A read of an overflow file that fails once (EIO) is tried again at
    /// the next round, and the payloads of its tasks are in memory before
    /// they fall due: receiving them reads nothing. (Before, the file was
    /// not prefetched again until a reopen.)
    #[test]
    fn a_failed_prefetch_read_is_retried_and_the_payloads_come_back_before_due() {
        let (sim, clock, engine, file) = due_within_window(61, 3);
        let mut p = Prefetcher::default();
        sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Any,
            kind: FaultKind::Eio,
        });
        assert_eq!(round(&engine, &mut p, &[file]), (1, 0));
        assert_eq!(
            p.cursors[&file],
            FileCursor {
                offset: overflow::HEADER_BYTES as u64,
                next_due_ms: None,
                failures: 1,
                retry_round: 2,
                damaged: false,
            }
        );
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (3, 0));
        // The fault has passed: the next round reads the file.
        assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
        assert_eq!(p.cursors[&file].failures, 0);
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (0, 3));
        assert_eq!(stats.payload_bytes_in_memory, 3 * payload(0).len());
        // Due: handed out with their payloads, nothing more read.
        clock.advance(Duration::from_millis(30_000 + 2));
        engine.run_until_idle();
        let consumer = engine.consumer();
        for i in 0..3 {
            let d = consumer.try_recv().expect("due");
            assert_eq!(d.key(), format!("k{i}").as_bytes());
            assert_eq!(d.payload(), &payload(i)[..]);
            consumer.ack(&d).expect("ack");
        }
        assert_eq!(engine.stats().payloads_read_back, 3);
        engine.shutdown().expect("shutdown");
    }

    /// A file that keeps failing is read again after 1, 2, 4, … rounds;
    /// the first read that succeeds takes every payload due and ends the
    /// backoff.
    #[test]
    fn a_file_that_keeps_failing_is_read_again_with_a_doubling_backoff() {
        let (sim, _clock, engine, file) = due_within_window(62, 2);
        let mut p = Prefetcher::default();
        // Rounds 1, 2, 4 and 8 read (and fail); 3, 5–7 wait.
        let mut warnings = Vec::new();
        for _ in 1..=8 {
            sim.inject(FaultPlan {
                after: 0,
                op: FaultOp::Any,
                kind: FaultKind::Eio,
            });
            warnings.push(round(&engine, &mut p, &[file]).0);
            sim.clear_faults();
        }
        assert_eq!(warnings, [1, 1, 0, 1, 0, 0, 0, 1]);
        assert_eq!(p.cursors[&file].failures, 4);
        assert_eq!(p.cursors[&file].retry_round, 16);
        assert_eq!(engine.stats().payloads_on_disk, 2);
        for _ in 9..16 {
            assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
            assert_eq!(engine.stats().payloads_on_disk, 2);
        }
        assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
        assert_eq!(p.cursors[&file].failures, 0);
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (0, 2));
        engine.shutdown().expect("shutdown");
    }

    /// A file a checkpoint removed between the round's listing and its read
    /// (its tasks gone) is dropped without a warning, and not read again.
    #[test]
    fn a_file_removed_before_its_read_is_dropped_quietly() {
        let (_sim, _clock, engine, file) = due_within_window(63, 1);
        // The round's listing, then the checkpoint that removes the file.
        let files = [file];
        assert!(engine.cancel(b"k0").expect("cancel").is_cancelled());
        assert_eq!(
            engine
                .checkpoint()
                .expect("checkpoint")
                .overflow_files_removed,
            1
        );
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &files), (0, 1));
        assert!(p.cursors.is_empty(), "{:?}", p.cursors);
        assert_eq!(engine.stats().payloads_read_back, 0);
        engine.shutdown().expect("shutdown");
    }

    /// Where the payload of the task with key `key` is on disk: (file,
    /// offset).
    fn payload_at(engine: &Engine, key: &[u8]) -> (u32, u64) {
        let core = engine.shared.core.lock();
        let at = core
            .tasks
            .iter()
            .find(|t| core.payloads.key(&t.bytes) == key)
            .and_then(|t| t.bytes.on_disk());
        at.expect("a task with its payload on disk")
    }

    /// Flips a byte of the payload of the entry at `offset` of overflow
    /// file `file` (keys of at most 8 bytes): its checksum fails.
    fn damage(sim: &SimStorage, engine: &Engine, file: u32, offset: u64) {
        let path = engine
            .shared
            .disk
            .as_ref()
            .expect("on disk")
            .overflow_dir()
            .join(overflow::file_name(file));
        let handle = sim.open(&path, OpenMode::ReadWrite).expect("open");
        let at = offset + overflow::ENTRY_FIXED_BYTES as u64 + 8;
        let mut byte = [0u8];
        handle.read_at(&mut byte, at).expect("read");
        handle.write_all_at(&[byte[0] ^ 0x55], at).expect("write");
    }

    /// The length of overflow file `file`.
    fn file_len(sim: &SimStorage, engine: &Engine, file: u32) -> u64 {
        let disk = engine.shared.disk.as_ref().expect("on disk");
        let path = disk.overflow_dir().join(overflow::file_name(file));
        sim.read_file(&path).expect("file").len() as u64
    }

    /// A cursor past the last entry of a file of `len` bytes, read without
    /// a failure.
    fn at_end(len: u64) -> FileCursor {
        FileCursor {
            offset: len,
            next_due_ms: Some(u64::MAX),
            failures: 0,
            retry_round: 0,
            damaged: false,
        }
    }

    /// A damaged entry that no task needs (its task cancelled since the
    /// checkpoint wrote it) followed by live tasks' entries: the round goes
    /// past it with one warning and prefetches every later payload, before
    /// its due time; the consumer gets each task with its payload, reading
    /// nothing. (Before, the file was not read again after the damage: the
    /// three later payloads were read at receive.)
    #[test]
    fn a_damaged_entry_no_task_needs_is_gone_past_and_later_payloads_are_prefetched() {
        let (sim, clock, engine, file) = due_within_window(64, 5);
        let (_, dead_at) = payload_at(&engine, b"k1");
        assert!(engine.cancel(b"k1").expect("cancel").is_cancelled());
        damage(&sim, &engine, file, dead_at);
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &[file]), (1, 0));
        assert_eq!(p.cursors[&file], at_end(file_len(&sim, &engine, file)));
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (0, 4));
        // Nothing due is left: the next round reads nothing.
        let ops = sim.io_ops();
        assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
        assert_eq!(sim.io_ops(), ops);
        // Due: handed out with their payloads, nothing more read.
        clock.advance(Duration::from_millis(30_000 + 5));
        engine.run_until_idle();
        let consumer = engine.consumer();
        for i in [0, 2, 3, 4] {
            let d = consumer.try_recv().expect("due");
            assert_eq!(d.key(), format!("k{i}").as_bytes());
            assert_eq!(d.payload(), &payload(i)[..]);
            consumer.ack(&d).expect("ack");
        }
        assert!(matches!(consumer.try_recv(), Err(crate::RecvError::Empty)));
        assert_eq!(engine.stats().payloads_read_back, 4);
        engine.shutdown().expect("shutdown");
    }

    /// A damaged entry that a live task needs: the round goes past it too
    /// (one warning; the prefetcher poisons nothing) and prefetches the
    /// payloads after it; that task's payload stays on disk, and receiving
    /// it reads the entry and reports the damage as before — the engine is
    /// poisoned, naming the file and the offset.
    #[test]
    fn a_damaged_entry_a_task_needs_is_gone_past_and_receiving_that_task_reports_it() {
        let (sim, clock, engine, file) = due_within_window(69, 4);
        let (_, needed_at) = payload_at(&engine, b"k1");
        damage(&sim, &engine, file, needed_at);
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &[file]), (1, 0));
        assert_eq!(p.cursors[&file], at_end(file_len(&sim, &engine, file)));
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (1, 3));
        assert_eq!(payload_at(&engine, b"k1"), (file, needed_at));
        assert!(engine.shared.core.lock().status == super::super::Status::Open);
        clock.advance(Duration::from_millis(30_000 + 4));
        engine.run_until_idle();
        let consumer = engine.consumer();
        let d = consumer.try_recv().expect("due");
        assert_eq!((d.key(), d.payload()), (&b"k0"[..], &payload(0)[..]));
        consumer.ack(&d).expect("ack");
        match consumer.try_recv() {
            Err(crate::RecvError::Poisoned { cause }) => {
                let name = overflow::file_name(file);
                assert!(
                    cause.contains(&name) && cause.contains(&format!("byte offset {needed_at}")),
                    "{cause}"
                );
            }
            other => panic!("receiving the task whose entry is damaged: {other:?}"),
        }
        assert_eq!(engine.stats().payloads_read_back, 3);
    }

    /// Damage at a file's last entry (a live task's): the payloads before
    /// it are prefetched, one warning, and the file is not read again — no
    /// I/O in later rounds.
    #[test]
    fn damage_at_the_last_entry_stops_the_prefetching_of_its_file() {
        let (sim, _clock, engine, file) = due_within_window(70, 3);
        let (_, last) = payload_at(&engine, b"k2");
        damage(&sim, &engine, file, last);
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &[file]), (1, 0));
        assert_eq!(
            p.cursors[&file],
            FileCursor {
                offset: last,
                next_due_ms: Some(START_MS + 10 * MINUTE_MS + 1),
                failures: 0,
                retry_round: 0,
                damaged: true,
            }
        );
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (1, 2));
        let ops = sim.io_ops();
        for _ in 0..3 {
            assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
        }
        assert_eq!(sim.io_ops(), ops, "a damaged file was read again");
        assert_eq!(engine.stats().payloads_on_disk, 1);
    }

    /// Damage over many entries live tasks need (a zeroed range, say): the
    /// round goes past each (one warning each; receiving those tasks
    /// reports it) and prefetches the payload after them — with one scan of
    /// the tasks for the file, not one per damaged entry (each O(tasks)
    /// under the engine's lock: a hole over 10 000 entries of an engine of
    /// a million tasks would hold it for 10^10 steps in one round).
    #[test]
    fn many_damaged_entries_cost_one_scan_of_the_tasks_per_round() {
        const N: u64 = 50;
        let (sim, _clock, engine, file) = due_within_window(72, N);
        for i in 0..N - 1 {
            let (_, at) = payload_at(&engine, format!("k{i}").as_bytes());
            damage(&sim, &engine, file, at);
        }
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &[file]), (N as usize - 1, 0));
        assert_eq!(p.cursors[&file], at_end(file_len(&sim, &engine, file)));
        let stats = engine.stats();
        assert_eq!(
            (stats.payloads_on_disk as u64, stats.payloads_read_back),
            (N - 1, 1)
        );
        assert_eq!(
            engine.shared.core.lock().needed_entry_scans,
            1,
            "scans of the tasks in one round"
        );
    }

    /// A damaged entry no task needs before the entries of far tasks not
    /// promoted yet: the round goes past it to the first far task's entry
    /// (a far task's entry is needed: its payload stays there once
    /// promoted), and once they are promoted and come within the window
    /// their payloads are prefetched. (Looking only at the tasks in memory,
    /// the file would not be read again.)
    #[test]
    fn a_damaged_entry_before_far_tasks_entries_does_not_stop_their_prefetching() {
        let storage = Counting::new(SimStorage::new(71));
        let clock = ManualClock::new(START_MS);
        let (engine, files) = far_files(&storage, &clock, 1);
        let file = files[0];
        let first = overflow::HEADER_BYTES as u64;
        assert!(engine.cancel(b"f0-000").expect("cancel").is_cancelled());
        damage(&storage.sim, &engine, file, first);
        let mut p = Prefetcher::default();
        assert_eq!(round(&engine, &mut p, &[file]), (1, 0));
        assert_eq!(
            p.cursors[&file],
            FileCursor {
                offset: first + FAR_ENTRY_BYTES,
                next_due_ms: Some(START_MS + DAY_MS + 1),
                failures: 0,
                retry_round: 0,
                damaged: false,
            }
        );
        // Half a minute before they fall due: promoted, and prefetched.
        clock.advance(Duration::from_millis(DAY_MS - 30_000));
        engine.run_until_idle();
        assert_eq!(engine.stats().far, 0);
        assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
        let stats = engine.stats();
        assert_eq!(
            (stats.payloads_on_disk as u64, stats.payloads_read_back),
            (0, FAR_PER_FILE - 1)
        );
        clock.advance(Duration::from_millis(30_000 + FAR_PER_FILE));
        engine.run_until_idle();
        let consumer = engine.consumer();
        for i in 1..FAR_PER_FILE {
            let d = consumer.try_recv().expect("due");
            assert_eq!(d.key(), format!("f0-{i:03}").as_bytes());
            assert_eq!(d.payload(), &payload(i)[..]);
            consumer.ack(&d).expect("ack");
        }
        assert_eq!(engine.stats().payloads_read_back, FAR_PER_FILE - 1);
        engine.shutdown().expect("shutdown");
    }

    /// The prefetcher reads a file the engine keeps open through that
    /// descriptor (an open would fail here), and one it does not keep
    /// through a descriptor of its own, which it does not add to those kept
    /// (the single reads of far cancels decide which stay open).
    #[test]
    fn the_prefetcher_reads_through_the_kept_descriptor_and_keeps_none() {
        let (sim, _clock, engine, file) = due_within_window(65, 2);
        let disk = engine.shared.disk.as_ref().expect("on disk");
        let mut p = Prefetcher::default();
        // Not kept: opened for the round, and not kept after it.
        assert!(disk.overflow_files_open().is_empty());
        engine
            .schedule(b"late", Due::After(Duration::from_secs(3600)), &payload(9))
            .expect("schedule");
        let second = {
            engine.checkpoint().expect("checkpoint");
            let files = overflow_file_numbers(&engine);
            assert_eq!(files.len(), 2);
            files[1]
        };
        assert_eq!(round(&engine, &mut p, &[second]), (0, 0));
        assert!(disk.overflow_files_open().is_empty());
        // Kept (as a far cancel would): no open.
        disk.overflow_file(file).expect("open");
        sim.inject(FaultPlan {
            after: 0,
            op: FaultOp::Open,
            kind: FaultKind::Eio,
        });
        assert_eq!(round(&engine, &mut p, &[file]), (0, 0));
        sim.clear_faults();
        let stats = engine.stats();
        assert_eq!((stats.payloads_on_disk, stats.payloads_read_back), (1, 2));
        assert_eq!(disk.overflow_files_open(), vec![file]);
        engine.shutdown().expect("shutdown");
    }
}
