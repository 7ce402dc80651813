//! Recovery's rules, in one place: rebuilding the live task set from the
//! engine's log records. The engine's open uses it (keeping payloads), and
//! `kairos verify` uses it to check a directory (keeping none). The rules are
//! specified in `wal/FORMAT.md`, "Kairos record bodies".

use crate::checkpoint::FarTask;
use crate::record::Record;
use std::collections::HashMap;

/// A map by task id, with a fast seeded hash (foldhash; SipHash dominated
/// recovery in the profile).
pub type IdMap<V> = HashMap<u64, V, foldhash::fast::RandomState>;
/// Live keys → task id without a second copy of each key: entries are
/// (key hash, id), and a hash match is confirmed against the task's key in
/// the task map (recovery's profile had a key clone, its allocation and its
/// free per task).
#[derive(Debug, Default)]
struct KeyIndex {
    table: hashbrown::HashTable<(u64, u64)>,
    hasher: foldhash::fast::RandomState,
}

impl KeyIndex {
    fn hash(&self, key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(key)
    }

    fn contains(&self, tasks: &IdMap<LiveTask>, hash: u64, key: &[u8]) -> bool {
        self.table
            .find(hash, |&(h, id)| {
                h == hash && tasks.get(&id).is_some_and(|t| *t.key == *key)
            })
            .is_some()
    }

    /// Adds `id` under `hash`; the caller checked the key is absent.
    fn insert(&mut self, hash: u64, id: u64) {
        self.table.insert_unique(hash, (hash, id), |&(h, _)| h);
    }

    fn remove(&mut self, key: &[u8], id: u64) {
        let hash = self.hash(key);
        if let Ok(e) = self.table.find_entry(hash, |&(h, i)| h == hash && i == id) {
            e.remove();
        }
    }

    fn reserve(&mut self, n: usize) {
        self.table.reserve(n, |&(h, _)| h);
    }
}

/// A task that is live after the records replayed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTask {
    /// Its key.
    pub key: Box<[u8]>,
    /// Its payload (empty when the replay keeps no payloads, or when it is
    /// in an overflow file: see `payload_at`).
    pub payload: Box<[u8]>,
    /// `(file, offset)` of its payload in an overflow file, when a
    /// checkpoint moved it there (`None`: `payload` holds it).
    pub payload_at: Option<(u32, u64)>,
    /// Due time of its next attempt, UTC ms.
    pub due_ms: u64,
    /// Deliveries so far: DELIVER records, less RELEASE records (0 = never
    /// delivered).
    pub deliveries: u32,
    /// Handed to the consumers by its last DELIVER and not yet acked,
    /// retried, dead-lettered or released: a restart redelivers it.
    pub in_flight: bool,
    /// The error text of its last failed attempt (empty if none).
    pub last_error: Box<[u8]>,
}

/// A dead letter: a task that exhausted its attempts, kept until purged or
/// requeued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadTask {
    /// Its key.
    pub key: Box<[u8]>,
    /// Its payload (empty when the replay keeps no payloads).
    pub payload: Box<[u8]>,
    /// Due time of its last attempt, UTC ms.
    pub due_ms: u64,
    /// Deliveries it had.
    pub deliveries: u32,
    /// When it was dead-lettered, UTC ms.
    pub dead_ms: u64,
    /// The error text of its last attempt.
    pub error: Box<[u8]>,
}

/// A record that breaks the replay rules: the log is not one the engine
/// wrote (or it was tampered with).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

/// The live task set and the dead letters, rebuilt record by record.
///
/// Memory: one entry per live task and per dead letter (its key, and its
/// payload if kept).
#[derive(Debug, Default)]
pub struct Replay {
    tasks: IdMap<LiveTask>,
    keys: KeyIndex,
    dead: IdMap<DeadTask>,
    /// Dead letters whose payload is still in an overflow file (a
    /// checkpoint had moved it there before the task died): `(file, offset)`
    /// by id. The engine reads them back at open.
    dead_on_disk: IdMap<(u32, u64)>,
    max_id: u64,
    keep_payloads: bool,
    /// Far tasks from the checkpoint (no key in memory), sorted by id;
    /// finished ones stay in place, marked in `far_gone` (so the order the
    /// binary search relies on holds), and `far_live` counts the rest.
    far: Vec<FarTask>,
    far_gone: Vec<bool>,
    far_live: usize,
}

/// Reads a far task's key and due time from its overflow entry, for a
/// record that needs the task whole (`Err`: why it cannot be read).
pub type FarResolver<'a> = dyn FnMut(&FarTask) -> Result<(Box<[u8]>, u64), String> + 'a;

impl Replay {
    /// An empty replay; `keep_payloads` says whether live tasks keep their
    /// payload bytes (the engine needs them; a verifier does not).
    pub fn new(keep_payloads: bool) -> Replay {
        Replay {
            keep_payloads,
            ..Replay::default()
        }
    }

    /// A replay that starts from a checkpoint's state rather than from an
    /// empty log: records after the checkpoint's LSN are then applied with
    /// [`Replay::apply_with`] (or [`Replay::apply`]). `max_id` is the largest
    /// task id ever assigned.
    ///
    /// # Errors
    /// Two live tasks with one key, or an id above `max_id` (a checkpoint
    /// the engine did not write).
    pub fn from_checkpoint(
        max_id: u64,
        tasks: Vec<(u64, LiveTask)>,
        dead: Vec<(u64, DeadTask)>,
        keep_payloads: bool,
    ) -> Result<Replay, RuleError> {
        let mut r = Replay {
            max_id,
            keep_payloads,
            ..Replay::default()
        };
        r.tasks.reserve(tasks.len());
        r.keys.reserve(tasks.len());
        for (id, mut t) in tasks {
            if id > max_id {
                return Err(rule("checkpoint", id, "whose id exceeds the largest id"));
            }
            let hash = r.keys.hash(&t.key);
            if r.keys.contains(&r.tasks, hash, &t.key) {
                return Err(RuleError(format!(
                    "checkpoint holds key {:?} twice",
                    String::from_utf8_lossy(&t.key)
                )));
            }
            r.keys.insert(hash, id);
            if !keep_payloads {
                t.payload = Box::default();
            }
            r.tasks.insert(id, t);
        }
        for (id, mut t) in dead {
            if id > max_id {
                return Err(rule("checkpoint", id, "whose id exceeds the largest id"));
            }
            if !keep_payloads {
                t.payload = Box::default();
            }
            r.dead.insert(id, t);
        }
        Ok(r)
    }

    /// Adds the far tasks of the checkpoint the replay starts from. Far
    /// tasks are kept by id only (their keys are on disk): a cancel just
    /// drops one; a record that needs the task whole (deliver, reschedule)
    /// has its key read through the resolver given to
    /// [`Replay::apply_with`]. A schedule is not checked against the keys
    /// of far tasks (the engine that wrote the log did that).
    ///
    /// Replaces any far tasks added before.
    ///
    /// # Errors
    /// An id of 0 or above the largest id, or an id twice (also among the
    /// tasks).
    pub fn add_far(&mut self, mut far: Vec<FarTask>) -> Result<(), RuleError> {
        far.sort_unstable_by_key(|t| t.id);
        for w in far.windows(2) {
            if w[0].id == w[1].id {
                return Err(rule("checkpoint", w[0].id, "listed twice as a far task"));
            }
        }
        for t in &far {
            if t.id == 0 || t.id > self.max_id {
                return Err(rule(
                    "checkpoint",
                    t.id,
                    "whose id is 0 or exceeds the largest id",
                ));
            }
            if self.tasks.contains_key(&t.id) {
                return Err(rule("checkpoint", t.id, "listed as a task and a far task"));
            }
        }
        self.far_live = far.len();
        self.far_gone = vec![false; far.len()];
        self.far = far;
        Ok(())
    }

    /// The live far tasks (sorted by id), taking them out of the replay.
    pub fn take_far(&mut self) -> Vec<FarTask> {
        let far = std::mem::take(&mut self.far);
        let gone = std::mem::take(&mut self.far_gone);
        self.far_live = 0;
        far.into_iter()
            .zip(gone)
            .filter_map(|(t, gone)| (!gone).then_some(t))
            .collect()
    }

    /// The live far tasks, by id.
    pub fn far(&self) -> impl Iterator<Item = &FarTask> {
        self.far
            .iter()
            .zip(&self.far_gone)
            .filter_map(|(t, gone)| (!gone).then_some(t))
    }

    /// Far tasks still live.
    pub fn far_tasks(&self) -> usize {
        self.far_live
    }

    /// Position of live far task `id`.
    fn far_position(&self, id: u64) -> Option<usize> {
        if self.far_live == 0 {
            return None;
        }
        self.far
            .binary_search_by_key(&id, |t| t.id)
            .ok()
            .filter(|&pos| !self.far_gone[pos])
    }

    /// If `record` names a live far task: a cancel finishes it (`Ok(true)`:
    /// done); anything else first makes it an ordinary live task, its key
    /// and due time read through `resolve`.
    fn far_record(
        &mut self,
        record: &Record<'_>,
        resolve: &mut FarResolver<'_>,
    ) -> Result<bool, RuleError> {
        let id = match *record {
            Record::Schedule { .. } | Record::Purge { .. } => return Ok(false),
            Record::Cancel { id }
            | Record::Deliver { id, .. }
            | Record::Ack { id }
            | Record::Retry { id, .. }
            | Record::Release { id }
            | Record::Dead { id, .. }
            | Record::Reschedule { id, .. } => id.0,
        };
        if self.tasks.contains_key(&id) {
            return Ok(false);
        }
        let Some(pos) = self.far_position(id) else {
            return Ok(false);
        };
        if let Record::Cancel { .. } = record {
            self.far_gone[pos] = true;
            self.far_live -= 1;
            return Ok(true);
        }
        let t = self.far[pos];
        let (key, due_ms) = resolve(&t).map_err(|why| {
            RuleError(format!(
                "far task {id} (overflow file {}, offset {}): {why}",
                t.file, t.offset
            ))
        })?;
        let hash = self.keys.hash(&key);
        if self.keys.contains(&self.tasks, hash, &key) {
            return Err(RuleError(format!(
                "far task {id} has key {:?}, which is already live",
                String::from_utf8_lossy(&key)
            )));
        }
        self.keys.insert(hash, id);
        self.far_gone[pos] = true;
        self.far_live -= 1;
        self.tasks.insert(
            id,
            LiveTask {
                key,
                payload: Box::default(),
                payload_at: Some((t.file, t.offset)),
                due_ms,
                deliveries: 0,
                in_flight: false,
                last_error: Box::default(),
            },
        );
        Ok(false)
    }

    /// Applies one record, with no way to read far tasks' keys (a record
    /// needing one is refused). On `Err` nothing changed.
    pub fn apply(&mut self, record: &Record<'_>) -> Result<(), RuleError> {
        self.apply_with(record, &mut |_| {
            Err("its key is on disk and this replay reads no overflow file".into())
        })
    }

    /// Applies one record; `resolve` reads a far task's key and due time
    /// when the record needs the task whole. On `Err` nothing changed,
    /// except that a far task may have become an ordinary one.
    ///
    /// Rules (`wal/FORMAT.md`, "Replay rules"): a schedule's id exceeds every
    /// earlier id and its key is not live; a cancel names a live task (it is
    /// finished, in flight or not); a deliver names a live task not in
    /// flight; an ack, retry, dead or release names a live task in flight; a
    /// reschedule names a live task not in flight; a purge names a dead
    /// letter.
    pub fn apply_with(
        &mut self,
        record: &Record<'_>,
        resolve: &mut FarResolver<'_>,
    ) -> Result<(), RuleError> {
        if self.far_record(record, resolve)? {
            return Ok(());
        }
        match *record {
            Record::Schedule {
                id,
                due_ms,
                key,
                payload,
            } => {
                if id.0 <= self.max_id {
                    return Err(RuleError(format!(
                        "task id {} does not exceed the previous maximum {}",
                        id.0, self.max_id
                    )));
                }
                let hash = self.keys.hash(key);
                if self.keys.contains(&self.tasks, hash, key) {
                    return Err(RuleError(format!(
                        "schedule of key {:?}, which is already live",
                        String::from_utf8_lossy(key)
                    )));
                }
                self.max_id = id.0;
                self.keys.insert(hash, id.0);
                let payload = if self.keep_payloads { payload } else { &[] };
                self.tasks.insert(
                    id.0,
                    LiveTask {
                        key: key.into(),
                        payload: payload.into(),
                        payload_at: None,
                        due_ms,
                        deliveries: 0,
                        in_flight: false,
                        last_error: Box::default(),
                    },
                );
            }
            Record::Cancel { id } => {
                self.live(id.0, "cancel")?;
                self.finish(id.0);
            }
            Record::Deliver { id, .. } => {
                let t = self.waiting(id.0, "deliver")?;
                t.deliveries = t.deliveries.saturating_add(1);
                t.in_flight = true;
            }
            Record::Ack { id } => {
                self.in_flight(id.0, "ack")?;
                self.finish(id.0);
            }
            Record::Retry { id, due_ms, error } => {
                let t = self.in_flight(id.0, "retry")?;
                t.in_flight = false;
                t.due_ms = due_ms;
                t.last_error = error.into();
            }
            Record::Release { id } => {
                let t = self.in_flight(id.0, "release")?;
                t.in_flight = false;
                t.deliveries = t.deliveries.saturating_sub(1);
            }
            Record::Dead { id, dead_ms, error } => {
                self.in_flight(id.0, "dead")?;
                if let Some(t) = self.finish(id.0) {
                    if let Some(at) = t.payload_at {
                        self.dead_on_disk.insert(id.0, at);
                    }
                    self.dead.insert(
                        id.0,
                        DeadTask {
                            key: t.key,
                            payload: t.payload,
                            due_ms: t.due_ms,
                            deliveries: t.deliveries,
                            dead_ms,
                            error: error.into(),
                        },
                    );
                }
            }
            Record::Purge { id } => {
                if self.dead.remove(&id.0).is_none() {
                    return Err(rule("purge", id.0, "which is not a dead letter"));
                }
                self.dead_on_disk.remove(&id.0);
            }
            Record::Reschedule {
                id,
                due_ms,
                payload,
            } => {
                let keep_payloads = self.keep_payloads;
                let t = self.waiting(id.0, "reschedule")?;
                t.due_ms = due_ms;
                if let Some(p) = payload {
                    t.payload_at = None;
                    if keep_payloads {
                        t.payload = p.into();
                    }
                }
            }
        }
        Ok(())
    }

    fn live(&mut self, id: u64, kind: &str) -> Result<&mut LiveTask, RuleError> {
        self.tasks
            .get_mut(&id)
            .ok_or_else(|| rule(kind, id, "which is not live"))
    }

    fn waiting(&mut self, id: u64, kind: &str) -> Result<&mut LiveTask, RuleError> {
        match self.live(id, kind)? {
            t if !t.in_flight => Ok(t),
            _ => Err(rule(kind, id, "which is in flight")),
        }
    }

    fn in_flight(&mut self, id: u64, kind: &str) -> Result<&mut LiveTask, RuleError> {
        match self.live(id, kind)? {
            t if t.in_flight => Ok(t),
            _ => Err(rule(kind, id, "which is not in flight")),
        }
    }

    /// Live tasks so far, far ones included.
    pub fn live_tasks(&self) -> usize {
        self.tasks.len() + self.far_live
    }

    /// Dead letters so far.
    pub fn dead_letters(&self) -> usize {
        self.dead.len()
    }

    /// The live tasks so far, in no particular order; far tasks are not
    /// among them (see [`Replay::far`]).
    pub fn tasks(&self) -> impl Iterator<Item = &LiveTask> {
        self.tasks.values()
    }

    /// The largest task id seen (0 if none).
    pub fn max_id(&self) -> u64 {
        self.max_id
    }

    /// Dead letters whose payload is in an overflow file: `(file, offset)`
    /// by id (their `DeadTask::payload` is empty until read back).
    pub fn dead_payloads_on_disk(&self) -> &IdMap<(u32, u64)> {
        &self.dead_on_disk
    }

    /// The live tasks and the dead letters, by id; far tasks are not among
    /// them (take them first with [`Replay::take_far`]).
    pub fn into_parts(self) -> (IdMap<LiveTask>, IdMap<DeadTask>) {
        (self.tasks, self.dead)
    }

    fn finish(&mut self, id: u64) -> Option<LiveTask> {
        let t = self.tasks.remove(&id)?;
        self.keys.remove(&t.key, id);
        Some(t)
    }
}

fn rule(kind: &str, id: u64, why: &str) -> RuleError {
    RuleError(format!("{kind} record for task {id} {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskId;

    fn schedule(id: u64, key: &'static [u8]) -> Record<'static> {
        Record::Schedule {
            id: TaskId(id),
            due_ms: 5,
            key,
            payload: b"p",
        }
    }

    #[test]
    fn lifecycle_and_rule_breaks() {
        let mut r = Replay::new(true);
        r.apply(&schedule(1, b"a")).unwrap();
        r.apply(&schedule(2, b"b")).unwrap();
        assert!(r.apply(&schedule(2, b"c")).is_err(), "id not increasing");
        assert!(r.apply(&schedule(3, b"a")).is_err(), "key live");
        assert!(
            r.apply(&Record::Ack { id: TaskId(1) }).is_err(),
            "never delivered"
        );
        let deliver = |id| Record::Deliver {
            id: TaskId(id),
            fired_ms: 6,
        };
        r.apply(&deliver(1)).unwrap();
        assert!(r.apply(&deliver(1)).is_err(), "in flight");
        r.apply(&Record::Ack { id: TaskId(1) }).unwrap();
        r.apply(&Record::Cancel { id: TaskId(2) }).unwrap();
        assert!(
            r.apply(&Record::Cancel { id: TaskId(2) }).is_err(),
            "not live"
        );
        assert_eq!(r.live_tasks(), 0);
        r.apply(&schedule(3, b"a")).unwrap();
        assert_eq!(r.max_id(), 3);
        let (tasks, _) = r.into_parts();
        assert_eq!(tasks[&3].payload.as_ref(), b"p");
    }

    #[test]
    fn retries_dead_letters_and_releases() {
        let mut r = Replay::new(true);
        let deliver = |id| Record::Deliver {
            id: TaskId(id),
            fired_ms: 6,
        };
        r.apply(&schedule(1, b"a")).unwrap();
        assert!(r.apply(&Record::Release { id: TaskId(1) }).is_err());
        r.apply(&deliver(1)).unwrap();
        r.apply(&Record::Release { id: TaskId(1) }).unwrap();
        r.apply(&deliver(1)).unwrap();
        let retry = Record::Retry {
            id: TaskId(1),
            due_ms: 50,
            error: b"boom",
        };
        r.apply(&retry).unwrap();
        assert!(r.apply(&retry).is_err(), "not in flight");
        let reschedule = Record::Reschedule {
            id: TaskId(1),
            due_ms: 60,
            payload: Some(b"q"),
        };
        r.apply(&reschedule).unwrap();
        let t = &r.tasks[&1];
        assert_eq!((t.deliveries, t.in_flight, t.due_ms), (1, false, 60));
        assert_eq!((&*t.last_error, &*t.payload), (&b"boom"[..], &b"q"[..]));
        r.apply(&deliver(1)).unwrap();
        assert!(r.apply(&reschedule).is_err(), "in flight");
        r.apply(&Record::Dead {
            id: TaskId(1),
            dead_ms: 70,
            error: b"again",
        })
        .unwrap();
        assert_eq!((r.live_tasks(), r.dead_letters()), (0, 1));
        // The key is free again while the dead letter is kept.
        r.apply(&schedule(2, b"a")).unwrap();
        r.apply(&Record::Purge { id: TaskId(1) }).unwrap();
        assert!(r.apply(&Record::Purge { id: TaskId(1) }).is_err());
        // Cancel finishes a task in flight too.
        r.apply(&deliver(2)).unwrap();
        r.apply(&Record::Cancel { id: TaskId(2) }).unwrap();
        assert!(r.apply(&Record::Ack { id: TaskId(2) }).is_err());
        assert_eq!((r.live_tasks(), r.dead_letters()), (0, 0));
    }

    #[test]
    fn far_tasks_stay_findable_after_others_finish() {
        let far = |id| FarTask {
            id,
            key_hash: id * 11,
            file: 1,
            offset: 64 * id,
        };
        let mut r = Replay::from_checkpoint(9, Vec::new(), Vec::new(), false).unwrap();
        r.add_far(vec![far(5), far(3), far(4), far(8)]).unwrap();
        assert_eq!((r.far_tasks(), r.live_tasks()), (4, 4));
        // Cancel 4: dropped without reading its entry.
        let reads = std::cell::RefCell::new(Vec::new());
        let mut resolve = |t: &FarTask| -> Result<(Box<[u8]>, u64), String> {
            reads.borrow_mut().push(t.id);
            Ok((format!("k{}", t.id).into_bytes().into(), 1000 + t.id))
        };
        r.apply_with(&Record::Cancel { id: TaskId(4) }, &mut resolve)
            .unwrap();
        // 3 (before the gap) and 5, 8 (after it) are still found and read when needed.
        for id in [3, 5, 8] {
            r.apply_with(
                &Record::Deliver {
                    id: TaskId(id),
                    fired_ms: 7,
                },
                &mut resolve,
            )
            .unwrap();
        }
        assert_eq!(*reads.borrow(), [3, 5, 8]);
        assert_eq!((r.far_tasks(), r.live_tasks()), (0, 3));
        let t = &r.tasks[&5];
        assert_eq!(
            (&*t.key, t.due_ms, t.payload_at, t.in_flight),
            (&b"k5"[..], 1005, Some((1, 320)), true)
        );
        // 4 is gone: a second cancel is a rule break, not a far task.
        assert!(r
            .apply_with(&Record::Cancel { id: TaskId(4) }, &mut resolve)
            .is_err());
        assert_eq!(r.take_far(), []);
    }

    #[test]
    fn take_far_leaves_out_the_finished() {
        let far = |id| FarTask {
            id,
            key_hash: 0,
            file: 2,
            offset: 64,
        };
        let mut r = Replay::from_checkpoint(9, Vec::new(), Vec::new(), false).unwrap();
        r.add_far(vec![far(7), far(2), far(9)]).unwrap();
        r.apply(&Record::Cancel { id: TaskId(7) }).unwrap();
        assert_eq!(r.live_tasks(), 2);
        assert_eq!(r.take_far(), [far(2), far(9)]);
        assert_eq!((r.far_tasks(), r.live_tasks()), (0, 0));
    }

    #[test]
    fn verifier_keeps_no_payloads() {
        let mut r = Replay::new(false);
        r.apply(&schedule(1, b"a")).unwrap();
        assert!(r.into_parts().0[&1].payload.is_empty());
    }
}
