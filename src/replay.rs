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

    /// Whether a live task has `key` (hash `hash`); `key_of` gives a live
    /// task's key by id.
    fn contains<'a>(
        &self,
        key_of: impl Fn(u64) -> Option<&'a [u8]>,
        hash: u64,
        key: &[u8],
    ) -> bool {
        self.table
            .find(hash, |&(h, id)| h == hash && key_of(id) == Some(key))
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

/// Where each of a checkpoint's live tasks is in `Replay::base`, by id.
#[derive(Debug)]
enum BaseIndex {
    /// `pos[id - first]` (`u32::MAX`: none), when the ids are dense enough
    /// that the table costs at most 16 bytes per task: no hashing, one
    /// read per lookup (task ids are assigned in sequence, and a
    /// checkpoint's live ones usually cover a good share of their range).
    Direct { first: u64, pos: Vec<u32> },
    /// A hash map otherwise.
    Map(IdMap<u32>),
}

impl BaseIndex {
    fn get(&self, id: u64) -> Option<u32> {
        match self {
            BaseIndex::Direct { first, pos } => {
                let i = usize::try_from(id.checked_sub(*first)?).ok()?;
                pos.get(i).copied().filter(|&p| p != u32::MAX)
            }
            BaseIndex::Map(map) => map.get(&id).copied(),
        }
    }

    fn remove(&mut self, id: u64) -> Option<u32> {
        match self {
            BaseIndex::Direct { first, pos } => {
                let i = usize::try_from(id.checked_sub(*first)?).ok()?;
                let slot = pos.get_mut(i)?;
                let p = std::mem::replace(slot, u32::MAX);
                (p != u32::MAX).then_some(p)
            }
            BaseIndex::Map(map) => map.remove(&id),
        }
    }
}

/// Key bytes kept in the value itself up to this many (one allocator chunk
/// of 32 bytes or more saved per task: recovery reads millions of keys).
pub const TASK_KEY_INLINE_BYTES: usize = 30;

/// A replayed task's key: up to [`TASK_KEY_INLINE_BYTES`] bytes in the value
/// itself (no allocation, and none to free), longer ones in a boxed slice.
/// 32 bytes (checked below). Dereferences to the key bytes; built with
/// `From<&[u8]>` or `From<Box<[u8]>>`.
///
/// Recovery decodes one key per live task; keeping the typical short key
/// inline makes the decoding allocation-free and lets the engine keep it in
/// the task's entry (with no allocation of its own) without freeing millions
/// of small allocations in due order.
#[derive(Clone)]
pub struct TaskKey(KeyRepr);

#[derive(Clone)]
enum KeyRepr {
    /// At most [`TASK_KEY_INLINE_BYTES`] bytes: the first `len` of `bytes`.
    Inline {
        len: u8,
        bytes: [u8; TASK_KEY_INLINE_BYTES],
    },
    /// A longer key.
    Heap(Box<[u8]>),
}

const _: () = assert!(std::mem::size_of::<TaskKey>() == 32);

impl TaskKey {
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            // `len` ≤ TASK_KEY_INLINE_BYTES: only `From` builds one.
            KeyRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyRepr::Heap(b) => b,
        }
    }

    /// Whether the key is held in the value itself (no allocation).
    pub fn is_inline(&self) -> bool {
        matches!(self.0, KeyRepr::Inline { .. })
    }

    /// The key's allocation, if it has one (a key longer than
    /// [`TASK_KEY_INLINE_BYTES`]); otherwise the key back.
    pub fn into_heap(self) -> Result<Box<[u8]>, TaskKey> {
        match self.0 {
            KeyRepr::Heap(b) => Ok(b),
            inline => Err(TaskKey(inline)),
        }
    }

    /// The key as a boxed slice (allocates for an inline key).
    pub fn into_boxed(self) -> Box<[u8]> {
        match self.into_heap() {
            Ok(b) => b,
            Err(inline) => inline.as_bytes().into(),
        }
    }
}

impl From<&[u8]> for TaskKey {
    fn from(key: &[u8]) -> Self {
        if key.len() <= TASK_KEY_INLINE_BYTES {
            let mut bytes = [0u8; TASK_KEY_INLINE_BYTES];
            bytes[..key.len()].copy_from_slice(key);
            // At most TASK_KEY_INLINE_BYTES (checked above).
            TaskKey(KeyRepr::Inline {
                len: key.len() as u8,
                bytes,
            })
        } else {
            TaskKey(KeyRepr::Heap(key.into()))
        }
    }
}

impl From<Box<[u8]>> for TaskKey {
    /// Keeps a long key's allocation; a short one moves inline.
    fn from(key: Box<[u8]>) -> Self {
        if key.len() <= TASK_KEY_INLINE_BYTES {
            TaskKey::from(&*key)
        } else {
            TaskKey(KeyRepr::Heap(key))
        }
    }
}

impl From<TaskKey> for Box<[u8]> {
    fn from(key: TaskKey) -> Self {
        key.into_boxed()
    }
}

impl std::ops::Deref for TaskKey {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for TaskKey {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for TaskKey {
    /// Equal when the key bytes are (however they are held).
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for TaskKey {}

impl std::hash::Hash for TaskKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::fmt::Debug for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_bytes().fmt(f)
    }
}

/// A task that is live after the records replayed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTask {
    /// Its key (short keys inline: see [`TaskKey`]).
    pub key: TaskKey,
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
    /// Live tasks made by records (or read back from the far list).
    tasks: IdMap<LiveTask>,
    /// The live tasks of the checkpoint the replay started from, in the
    /// checkpoint's order (`None` once finished). Kept in a vector with an
    /// id → position map rather than moved into `tasks`: at millions of
    /// tasks recovery's cost is memory traffic, and a 16-byte map entry
    /// per task costs a fifth of a whole task's.
    base: Vec<(u64, Option<LiveTask>)>,
    /// Position in `base` of each live task there; built at the first
    /// record that names a task (a reopen right after a checkpoint never
    /// needs it).
    base_at: Option<BaseIndex>,
    /// Live tasks in `base`.
    base_live: usize,
    /// Live keys, for the rule that a schedule's key is not live; built
    /// at the first record that needs it, from every live task.
    keys: Option<KeyIndex>,
    /// The key rule is off ([`Replay::without_key_rule`]).
    skip_key_rule: bool,
    dead: IdMap<DeadTask>,
    /// Dead letters whose payload is still in an overflow file (a
    /// checkpoint had moved it there before the task died): `(file, offset)`
    /// by id. The engine reads them back at open.
    dead_on_disk: IdMap<(u32, u64)>,
    max_id: u64,
    keep_payloads: bool,
    /// Far tasks from the checkpoint (no key in memory): in the
    /// checkpoint's order until a record first needs one by id, then sorted
    /// by id (`far_by_id`); finished ones stay in place, marked in
    /// `far_gone` (so the order the binary search relies on holds), and
    /// `far_live` counts the rest.
    far: Vec<FarTask>,
    far_gone: Vec<bool>,
    far_live: usize,
    /// Whether `far` is sorted by id.
    far_by_id: bool,
    /// Far tasks a record needed whole whose entry did not read back: held
    /// by id as ordinary live tasks with an empty key (see
    /// [`Replay::unresolved_at_end`]).
    unresolved: IdMap<Unresolved>,
}

/// A far task whose overflow entry a record after the checkpoint needed
/// (its key and due time) and could not read: the replay goes on with it
/// held by id, since later records may finish it, and fails only if it is
/// still live — or a dead letter — at the end of the log
/// ([`Replay::unresolved_at_end`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The task's id.
    pub id: u64,
    /// The overflow file number of its entry.
    pub file: u32,
    /// Byte offset of its entry in that file.
    pub offset: u64,
    /// Why the entry did not read back.
    pub why: String,
}

/// A far task held by id ([`Unresolved`]) that is still live, or a dead
/// letter, at the end of the log ([`Replay::unresolved_at_end`]): its key
/// (and due time, and payload unless it was given a new one) is lost with
/// its entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StillHeld {
    /// The task.
    pub task: Unresolved,
    /// Whether it is a dead letter (else a live task).
    pub dead_letter: bool,
}

impl StillHeld {
    /// What it is at the end of the log: `"live"` or `"a dead letter"`.
    pub fn state(&self) -> &'static str {
        if self.dead_letter {
            "a dead letter"
        } else {
            "live"
        }
    }

    /// What `kairos salvage --discard` writes for it: `"cancels"` or
    /// `"purges"`.
    pub fn discard_verb(&self) -> &'static str {
        if self.dead_letter {
            "purges"
        } else {
            "cancels"
        }
    }
}

impl std::fmt::Display for StillHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "far task {} (overflow file {}, offset {}) is {} at the end of the log, and its \
             entry, which a record after the checkpoint needed for its key, does not read back: \
             {} (`kairos salvage` lists it; `--discard` {} it)",
            self.task.id,
            self.task.file,
            self.task.offset,
            self.state(),
            self.task.why,
            self.discard_verb()
        )
    }
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
    /// The tasks are kept in the order given, and the two tables the rules
    /// need are built only when a record needs them: id → task at the first
    /// record naming a task, live keys at the first schedule (or far task
    /// read back), unless the key rule is off ([`Replay::without_key_rule`],
    /// as the engine's open has it: its own index checks that no key is live
    /// twice). Until then a replay costs one move per task, so reopening
    /// right after a checkpoint builds no table here at all.
    ///
    /// # Errors
    /// An id above `max_id` (a checkpoint the engine did not write). Two
    /// tasks with one id, or two with one key, are refused by the record
    /// that builds the table that shows it (see above), or by
    /// [`Replay::build_tables`].
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
        if u32::try_from(tasks.len()).is_err() {
            return Err(RuleError(format!(
                "checkpoint holds {} tasks, more than a replay can hold",
                tasks.len()
            )));
        }
        r.base = tasks
            .into_iter()
            .map(|(id, mut t)| {
                if !keep_payloads {
                    t.payload = Box::default();
                }
                (id, Some(t))
            })
            .collect();
        if let Some((id, _)) = r.base.iter().find(|(id, _)| *id > max_id) {
            return Err(rule("checkpoint", *id, "whose id exceeds the largest id"));
        }
        r.base_live = r.base.len();
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

    /// Builds `base_at` if it is not built yet.
    ///
    /// # Errors
    /// An id twice among the checkpoint's tasks.
    fn index_base(&mut self) -> Result<(), RuleError> {
        if self.base_at.is_some() {
            return Ok(());
        }
        let live = || {
            self.base
                .iter()
                .enumerate()
                .filter(|(_, (_, t))| t.is_some())
        };
        let (first, last) = live().fold((u64::MAX, 0), |(lo, hi), (_, (id, _))| {
            (lo.min(*id), hi.max(*id))
        });
        let span = last.saturating_sub(first).saturating_add(1);
        let direct = usize::try_from(span)
            .ok()
            .filter(|&n| self.base_live > 0 && n / 4 <= self.base_live);
        let at = if let Some(span) = direct {
            // At most four entries (16 bytes) per live task.
            let mut pos = vec![u32::MAX; span];
            for (p, (id, _)) in live() {
                let slot = &mut pos[(id - first) as usize];
                if *slot != u32::MAX {
                    return Err(rule("checkpoint", *id, "listed twice"));
                }
                // Positions fit: `from_checkpoint` checked the length.
                *slot = p as u32;
            }
            BaseIndex::Direct { first, pos }
        } else {
            let mut map = IdMap::default();
            map.reserve(self.base_live);
            for (p, (id, _)) in live() {
                if map.insert(*id, p as u32).is_some() {
                    return Err(rule("checkpoint", *id, "listed twice"));
                }
            }
            BaseIndex::Map(map)
        };
        self.base_at = Some(at);
        Ok(())
    }

    /// Builds the live-key table if it is not built yet.
    ///
    /// # Errors
    /// Two live tasks with one key (a checkpoint the engine did not write).
    fn index_keys(&mut self) -> Result<(), RuleError> {
        if self.keys.is_some() {
            return Ok(());
        }
        self.index_base()?;
        let mut keys = KeyIndex::default();
        keys.reserve(self.base_live + self.tasks.len());
        let live = self
            .base
            .iter()
            .filter_map(|(id, t)| Some((*id, t.as_ref()?)))
            .chain(self.tasks.iter().map(|(id, t)| (*id, t)));
        for (id, t) in live {
            if self.unresolved.contains_key(&id) {
                continue; // key unknown
            }
            let hash = keys.hash(&t.key);
            if keys.contains(|id| self.key_of(id), hash, &t.key) {
                return Err(RuleError(format!(
                    "two live tasks have key {:?}",
                    String::from_utf8_lossy(&t.key)
                )));
            }
            keys.insert(hash, id);
        }
        self.keys = Some(keys);
        Ok(())
    }

    /// Builds now the tables [`Replay::from_checkpoint`] leaves to the first
    /// record that needs them, and so checks at once that the checkpoint's
    /// tasks have distinct ids and distinct keys (what `kairos verify`
    /// wants of a checkpoint even with no record after it); the keys only
    /// with the key rule on. Cost: one table insert per task, twice.
    ///
    /// # Errors
    /// An id or a key twice among the live tasks.
    pub fn build_tables(&mut self) -> Result<(), RuleError> {
        self.index_base()?;
        if self.skip_key_rule {
            return Ok(());
        }
        self.index_keys()
    }

    /// The live (non-far) task `id`, wherever it is kept. Needs `base_at`
    /// built ([`Replay::index_base`]) to find the checkpoint's tasks.
    fn task(&self, id: u64) -> Option<&LiveTask> {
        if let Some(pos) = self.base_at.as_ref().and_then(|at| at.get(id)) {
            return self.base.get(pos as usize)?.1.as_ref();
        }
        self.tasks.get(&id)
    }

    fn task_mut(&mut self, id: u64) -> Option<&mut LiveTask> {
        if let Some(pos) = self.base_at.as_ref().and_then(|at| at.get(id)) {
            return self.base.get_mut(pos as usize)?.1.as_mut();
        }
        self.tasks.get_mut(&id)
    }

    /// The key rule for task `id` becoming live with `key`: false if the
    /// key is live already; otherwise the key is recorded as `id`'s. Always
    /// true, recording nothing, with the rule off
    /// ([`Replay::without_key_rule`]).
    ///
    /// # Errors
    /// Building the live-key table found a key twice.
    fn claim_key(&mut self, key: &[u8], id: u64) -> Result<bool, RuleError> {
        if self.skip_key_rule {
            return Ok(true);
        }
        self.index_keys()?;
        let Some(keys) = &self.keys else {
            return Err(RuleError("the live-key table was not built".into()));
        };
        let hash = keys.hash(key);
        if keys.contains(|id| self.key_of(id), hash, key) {
            return Ok(false);
        }
        if let Some(keys) = &mut self.keys {
            keys.insert(hash, id);
        }
        Ok(true)
    }

    /// Turns off the rule that a schedule's key (or a far task's read back)
    /// is not live, so that the live-key table is never built: at 10 M tasks
    /// building it costs about as much as the rest of a reopen. The engine's
    /// open does this: it checks that the tasks it ends with have distinct
    /// keys, in its own index, built anyway. A log that broke the rule for a
    /// while and then finished one of the two tasks is accepted that way;
    /// `kairos verify` keeps the rule and reports it.
    #[must_use]
    pub fn without_key_rule(mut self) -> Replay {
        self.skip_key_rule = true;
        self.keys = None;
        self
    }

    fn key_of(&self, id: u64) -> Option<&[u8]> {
        self.task(id).map(|t| &*t.key)
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
    /// The far tasks' ids must not be among the checkpoint's tasks:
    /// [`crate::checkpoint::read`] refuses a file that lists an id twice,
    /// in any blocks.
    ///
    /// O(n + largest id / 64) when the largest id is at most 64 times the
    /// number of far tasks (a bitmap finds an id listed twice; the tasks
    /// keep the checkpoint's order, which [`FarIndex::build`] at open uses,
    /// and are sorted by id only if a record needs one); else O(n log n).
    ///
    /// # Errors
    /// An id of 0 or above the largest id, or an id twice among the far
    /// tasks.
    ///
    /// [`FarIndex::build`]: crate::far::FarIndex::build
    pub fn add_far(&mut self, mut far: Vec<FarTask>) -> Result<(), RuleError> {
        for t in &far {
            if t.id == 0 || t.id > self.max_id {
                return Err(rule(
                    "checkpoint",
                    t.id,
                    "whose id is 0 or exceeds the largest id",
                ));
            }
        }
        let by_id = self.max_id / 64 > far.len() as u64;
        if by_id {
            far.sort_unstable_by_key(|t| t.id);
            for w in far.windows(2) {
                if w[0].id == w[1].id {
                    return Err(rule("checkpoint", w[0].id, "listed twice as a far task"));
                }
            }
        } else {
            // max_id / 64 + 1 words: at most one per far task, and one more.
            let mut seen = vec![0u64; (self.max_id / 64 + 1) as usize];
            for t in &far {
                let (word, bit) = ((t.id / 64) as usize, 1u64 << (t.id % 64));
                if let Some(w) = seen.get_mut(word) {
                    if *w & bit != 0 {
                        return Err(rule("checkpoint", t.id, "listed twice as a far task"));
                    }
                    *w |= bit;
                }
            }
        }
        self.far_live = far.len();
        self.far_gone = vec![false; far.len()];
        self.far = far;
        self.far_by_id = by_id;
        Ok(())
    }

    /// Sorts the far tasks by id, if they are not yet (then none is marked
    /// gone: only a lookup by id, which sorts first, marks one).
    fn sort_far_by_id(&mut self) {
        if !self.far_by_id {
            self.far.sort_unstable_by_key(|t| t.id);
            self.far_by_id = true;
        }
    }

    /// The live far tasks (sorted by id), taking them out of the replay.
    pub fn take_far(&mut self) -> Vec<FarTask> {
        self.sort_far_by_id();
        self.take_far_unordered()
    }

    /// The live far tasks, taking them out of the replay: in the
    /// checkpoint's order (grouped by shard — the key hash's top byte —, which
    /// [`FarIndex::build`](crate::far::FarIndex::build) then sorts in
    /// O(n) passes) unless a record needed one by id; then by id.
    pub fn take_far_unordered(&mut self) -> Vec<FarTask> {
        let far = std::mem::take(&mut self.far);
        let gone = std::mem::take(&mut self.far_gone);
        self.far_live = 0;
        far.into_iter()
            .zip(gone)
            .filter_map(|(t, gone)| (!gone).then_some(t))
            .collect()
    }

    /// The live far tasks, in no particular order.
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

    /// Position of live far task `id` (sorting the far tasks by id the
    /// first time).
    fn far_position(&mut self, id: u64) -> Option<usize> {
        if self.far_live == 0 {
            return None;
        }
        self.sort_far_by_id();
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
        if self.task(id).is_some() {
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
        let (key, due_ms) = match resolve(&t) {
            Ok(read) => read,
            Err(why) => {
                // Later records may finish it (a far task that fired after
                // the checkpoint is delivered, then acked): hold it by id,
                // key unknown (not in the key table), and fail at the end
                // only if it is still live then.
                self.far_gone[pos] = true;
                self.far_live -= 1;
                self.unresolved.insert(
                    id,
                    Unresolved {
                        id,
                        file: t.file,
                        offset: t.offset,
                        why,
                    },
                );
                self.tasks.insert(
                    id,
                    LiveTask {
                        key: TaskKey::from(&[][..]),
                        payload: Box::default(),
                        payload_at: Some((t.file, t.offset)),
                        due_ms: 0,
                        deliveries: 0,
                        in_flight: false,
                        last_error: Box::default(),
                    },
                );
                return Ok(false);
            }
        };
        if !self.claim_key(&key, id)? {
            return Err(RuleError(format!(
                "far task {id} has key {:?}, which is already live",
                String::from_utf8_lossy(&key)
            )));
        }
        self.far_gone[pos] = true;
        self.far_live -= 1;
        self.tasks.insert(
            id,
            LiveTask {
                key: key.into(),
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
    /// except that a far task may have become an ordinary one. If `resolve`
    /// fails, the far task is held by id ([`Unresolved`]: key and due time
    /// unknown, outside the key rule) and the record applied to it; the
    /// caller checks at the end with [`Replay::unresolved_at_end`].
    ///
    /// Rules (`wal/FORMAT.md`, "Replay rules"): a schedule's id exceeds every
    /// earlier id and its key is not live (unless the key rule is off:
    /// [`Replay::without_key_rule`]); a cancel names a live task (it is
    /// finished, in flight or not); a deliver names a live task not in
    /// flight; an ack, retry, dead or release names a live task in flight; a
    /// reschedule names a live task not in flight; a purge names a dead
    /// letter.
    pub fn apply_with(
        &mut self,
        record: &Record<'_>,
        resolve: &mut FarResolver<'_>,
    ) -> Result<(), RuleError> {
        if !matches!(record, Record::Schedule { .. } | Record::Purge { .. }) {
            self.index_base()?;
        }
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
                if !self.claim_key(key, id.0)? {
                    return Err(RuleError(format!(
                        "schedule of key {:?}, which is already live",
                        String::from_utf8_lossy(key)
                    )));
                }
                self.max_id = id.0;
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
                            key: t.key.into(),
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
        self.task_mut(id)
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

    /// Checks, once every record is applied, that no far task whose entry a
    /// record needed and could not read ([`Unresolved`]) is still live or a
    /// dead letter: such a task has no key, due time or payload the replay
    /// could give back, so an engine cannot be built from it. Every caller
    /// that uses the live tasks or dead letters after the replay calls this
    /// first. Complexity: O(unresolved tasks).
    ///
    /// # Errors
    /// The one with the smallest id, if any.
    pub fn unresolved_at_end(&self) -> Result<(), StillHeld> {
        match self.unresolved_live().min_by_key(|u| u.id) {
            Some(u) => Err(StillHeld {
                task: u.clone(),
                dead_letter: self.dead.contains_key(&u.id),
            }),
            None => Ok(()),
        }
    }

    /// Every far task held by id so far, its entry unread ([`Unresolved`]),
    /// finished since or not, in no particular order.
    pub fn unresolved(&self) -> impl Iterator<Item = &Unresolved> {
        self.unresolved.values()
    }

    /// The far tasks held by id, their entry unread ([`Unresolved`]), that
    /// are live (their key is then empty) or dead letters so far, in no
    /// particular order.
    pub fn unresolved_live(&self) -> impl Iterator<Item = &Unresolved> {
        self.unresolved
            .values()
            .filter(|u| self.tasks.contains_key(&u.id) || self.dead.contains_key(&u.id))
    }

    /// Whether `id` is a dead letter so far.
    pub fn is_dead_letter(&self, id: u64) -> bool {
        self.dead.contains_key(&id)
    }

    /// Live tasks so far, far ones included.
    pub fn live_tasks(&self) -> usize {
        self.tasks.len() + self.base_live + self.far_live
    }

    /// Dead letters so far.
    pub fn dead_letters(&self) -> usize {
        self.dead.len()
    }

    /// The live tasks so far, in no particular order; far tasks are not
    /// among them (see [`Replay::far`]).
    pub fn tasks(&self) -> impl Iterator<Item = &LiveTask> {
        self.base
            .iter()
            .filter_map(|(_, t)| t.as_ref())
            .chain(self.tasks.values())
    }

    /// The live tasks so far with their ids, in no particular order; far
    /// tasks are not among them (see [`Replay::far`]).
    pub fn tasks_with_ids(&self) -> impl Iterator<Item = (u64, &LiveTask)> {
        self.base
            .iter()
            .filter_map(|(id, t)| Some((*id, t.as_ref()?)))
            .chain(self.tasks.iter().map(|(id, t)| (*id, t)))
    }

    /// The dead letters so far with their ids, in no particular order.
    pub fn dead_with_ids(&self) -> impl Iterator<Item = (u64, &DeadTask)> {
        self.dead.iter().map(|(id, t)| (*id, t))
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

    /// The live tasks with their ids, in no particular order, and the dead
    /// letters by id; far tasks are not among them (take them first with
    /// [`Replay::take_far`]).
    pub fn into_parts(self) -> (Vec<(u64, LiveTask)>, IdMap<DeadTask>) {
        // Collected in place: `Option<LiveTask>` is as big as `LiveTask`.
        let mut live: Vec<(u64, LiveTask)> = self
            .base
            .into_iter()
            .filter_map(|(id, t)| Some((id, t?)))
            .collect();
        live.extend(self.tasks);
        (live, self.dead)
    }

    fn finish(&mut self, id: u64) -> Option<LiveTask> {
        let t = match self.base_at.as_mut().and_then(|at| at.remove(id)) {
            Some(pos) => {
                let t = self.base.get_mut(pos as usize)?.1.take()?;
                self.base_live -= 1;
                t
            }
            None => self.tasks.remove(&id)?,
        };
        if let Some(keys) = &mut self.keys {
            keys.remove(&t.key, id);
        }
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
        assert_eq!(tasks.len(), 1);
        assert_eq!(tasks[0].0, 3);
        assert_eq!(tasks[0].1.payload.as_ref(), b"p");
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

    /// A far task whose entry does not read is held by id: later records
    /// apply to it by the rules, and the end check fails only while it is
    /// live or a dead letter, naming it.
    #[test]
    fn a_far_task_whose_entry_does_not_read_is_held_until_the_end() {
        let far = |id| FarTask {
            id,
            key_hash: 0,
            file: 3,
            offset: 64 * id,
        };
        let deliver = |id| Record::Deliver {
            id: TaskId(id),
            fired_ms: 7,
        };
        let mut r = Replay::from_checkpoint(9, Vec::new(), Vec::new(), true).unwrap();
        r.add_far(vec![far(2), far(4), far(6), far(8)]).unwrap();
        let mut damaged = |_: &FarTask| -> Result<(Box<[u8]>, u64), String> { Err("CRC".into()) };
        for id in [2, 4, 6, 8] {
            r.apply_with(&deliver(id), &mut damaged).unwrap();
        }
        assert_eq!((r.far_tasks(), r.live_tasks()), (0, 4));
        // 2 acked, 4 cancelled: finished. 6 dead-lettered, 8 in flight.
        r.apply(&Record::Ack { id: TaskId(2) }).unwrap();
        r.apply(&Record::Cancel { id: TaskId(4) }).unwrap();
        r.apply(&Record::Dead {
            id: TaskId(6),
            dead_ms: 9,
            error: b"e",
        })
        .unwrap();
        // The rules still hold for it: 8 is in flight, so a second DELIVER breaks them.
        assert!(r.apply(&deliver(8)).is_err());
        let end = |r: &Replay| {
            r.unresolved_at_end()
                .err()
                .map(|u| (u.task.id, u.task.file, u.task.offset, u.dead_letter))
        };
        assert_eq!(end(&r), Some((6, 3, 384, true)));
        let message = r.unresolved_at_end().err().map(|u| u.to_string());
        assert!(
            message.as_deref().is_some_and(
                |m| m.contains("is a dead letter") && m.contains("`--discard` purges it")
            ),
            "{message:?}"
        );
        let mut held: Vec<u64> = r.unresolved_live().map(|u| u.id).collect();
        held.sort_unstable();
        assert_eq!(held, [6, 8]);
        r.apply(&Record::Purge { id: TaskId(6) }).unwrap();
        assert_eq!(end(&r), Some((8, 3, 512, false)));
        let message = r.unresolved_at_end().err().map(|u| u.to_string());
        assert!(
            message.as_deref().is_some_and(|m| m.contains("far task 8")
                && m.contains("overflow file 3, offset 512")
                && m.contains("is live")
                && m.contains("`--discard` cancels it")
                && m.contains("CRC")),
            "{message:?}"
        );
        r.apply(&Record::Ack { id: TaskId(8) }).unwrap();
        assert_eq!(end(&r), None);
        assert_eq!((r.live_tasks(), r.dead_letters()), (0, 0));
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

    /// Far tasks keep the checkpoint's order until a record needs one by
    /// id: `take_far_unordered` gives them back as added, `take_far` by id;
    /// an id listed twice is refused whether a bitmap (largest id at most
    /// 64 per far task) or a sort finds it.
    #[test]
    fn far_tasks_keep_their_order_until_needed_by_id() {
        let far = |id| FarTask {
            id,
            key_hash: id,
            file: 3,
            offset: 64 * id,
        };
        let added = vec![far(7), far(2), far(9), far(4)];
        let mut r = Replay::from_checkpoint(9, Vec::new(), Vec::new(), false).unwrap();
        r.add_far(added.clone()).unwrap();
        assert_eq!(r.take_far_unordered(), added);
        let mut r = Replay::from_checkpoint(9, Vec::new(), Vec::new(), false).unwrap();
        r.add_far(added.clone()).unwrap();
        assert_eq!(r.take_far(), [far(2), far(4), far(7), far(9)]);
        // A lookup by id sorts them; what is left comes back by id.
        let mut r = Replay::from_checkpoint(9, Vec::new(), Vec::new(), false).unwrap();
        r.add_far(added.clone()).unwrap();
        r.apply(&Record::Cancel { id: TaskId(9) }).unwrap();
        assert_eq!(r.take_far_unordered(), [far(2), far(4), far(7)]);
        // Listed twice: found by the bitmap (largest id 9 ≤ 64 × 3) and by
        // the sort (largest id 1 000 > 64 × 3).
        for max_id in [9, 1_000] {
            let mut r = Replay::from_checkpoint(max_id, Vec::new(), Vec::new(), false).unwrap();
            let err = r.add_far(vec![far(7), far(2), far(7)]).unwrap_err();
            assert!(err.0.contains("listed twice"), "{max_id}: {err:?}");
            assert!(r.add_far(vec![far(7), far(10_000)]).is_err(), "{max_id}");
            r.add_far(vec![far(7), far(2)]).unwrap();
            assert_eq!(r.far_tasks(), 2);
        }
    }

    /// Random far tasks in random order, random records naming far and
    /// other ids: the replay agrees with a model whichever path (bitmap or
    /// sort, the largest id on either side of 64 per far task) and whichever
    /// take. (Written by a reviewing helper.)
    #[test]
    fn far_tasks_follow_a_model_whichever_path_and_take() {
        fn xs(s: &mut u64) -> u64 {
            *s ^= *s << 13;
            *s ^= *s >> 7;
            *s ^= *s << 17;
            *s
        }
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..400 {
            let n = (xs(&mut s) % 200) as usize;
            let max_id = match round % 4 {
                0 => n as u64 + 5,
                1 => 64 * n as u64 + 63,
                2 => 64 * n as u64 + 64,
                _ => u64::MAX - 1,
            };
            let mut ids = std::collections::BTreeSet::new();
            while ids.len() < n.min(max_id as usize) {
                let id = 1 + xs(&mut s) % max_id;
                ids.insert(id);
            }
            let mut far: Vec<FarTask> = ids
                .iter()
                .map(|&id| FarTask {
                    id,
                    key_hash: xs(&mut s),
                    file: 1 + (id % 3) as u32,
                    offset: 64 + id % 1000,
                })
                .collect();
            // shuffle
            for i in (1..far.len()).rev() {
                let j = (xs(&mut s) % (i as u64 + 1)) as usize;
                far.swap(i, j);
            }
            let all: Vec<u64> = ids.iter().copied().collect();
            let run = |unordered: bool, s0: u64| {
                let mut s = s0;
                let mut r = Replay::from_checkpoint(max_id, Vec::new(), Vec::new(), false)
                    .unwrap()
                    .without_key_rule();
                r.add_far(far.clone()).unwrap();
                let mut model: std::collections::BTreeSet<u64> = ids.clone();
                let mut promoted = std::collections::BTreeSet::new();
                let mut resolve = |t: &FarTask| -> Result<(Box<[u8]>, u64), String> {
                    Ok((format!("k{}", t.id).into_bytes().into(), 10))
                };
                let ops = xs(&mut s) % 40;
                for _ in 0..ops {
                    let id = if !all.is_empty() && !xs(&mut s).is_multiple_of(4) {
                        all[(xs(&mut s) % all.len() as u64) as usize]
                    } else {
                        xs(&mut s) % (max_id.min(1000) + 2)
                    };
                    let cancel = xs(&mut s).is_multiple_of(2);
                    let rec = if cancel {
                        Record::Cancel { id: TaskId(id) }
                    } else {
                        Record::Deliver {
                            id: TaskId(id),
                            fired_ms: 1,
                        }
                    };
                    let res = r.apply_with(&rec, &mut resolve);
                    let was_far = model.contains(&id);
                    let was_promoted = promoted.contains(&id);
                    if was_far {
                        assert!(res.is_ok(), "{res:?}");
                        model.remove(&id);
                        if !cancel {
                            promoted.insert(id);
                        }
                    } else if was_promoted {
                        // Cancel finishes it; a deliver of one in flight is refused.
                        if cancel {
                            assert!(res.is_ok());
                            promoted.remove(&id);
                        } else {
                            assert!(res.is_err());
                        }
                    } else {
                        assert!(res.is_err(), "id {id}");
                    }
                    assert_eq!(r.far_tasks(), model.len());
                    let mut seen: Vec<u64> = r.far().map(|t| t.id).collect();
                    seen.sort_unstable();
                    assert_eq!(seen, model.iter().copied().collect::<Vec<_>>());
                }
                assert_eq!(r.live_tasks(), model.len() + promoted.len());
                let got = if unordered {
                    r.take_far_unordered()
                } else {
                    r.take_far()
                };
                let mut got_ids: Vec<u64> = got.iter().map(|t| t.id).collect();
                if !unordered {
                    assert!(got_ids.is_sorted());
                }
                got_ids.sort_unstable();
                assert_eq!(got_ids, model.iter().copied().collect::<Vec<_>>());
                for t in &got {
                    assert!(far.contains(t));
                }
                assert_eq!(r.far_tasks(), 0);
            };
            let s0 = xs(&mut s);
            run(true, s0);
            run(false, s0);
        }
    }

    #[test]
    fn verifier_keeps_no_payloads() {
        let mut r = Replay::new(false);
        r.apply(&schedule(1, b"a")).unwrap();
        let (tasks, _) = r.into_parts();
        assert_eq!(tasks.len(), 1);
        assert!(tasks[0].1.payload.is_empty());
    }

    #[test]
    fn task_keys_up_to_the_inline_size_take_no_allocation() {
        for len in [
            0,
            1,
            24,
            TASK_KEY_INLINE_BYTES,
            TASK_KEY_INLINE_BYTES + 1,
            300,
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let inline = len <= TASK_KEY_INLINE_BYTES;
            let from_slice = TaskKey::from(&bytes[..]);
            let boxed: Box<[u8]> = bytes.clone().into();
            let heap_ptr = boxed.as_ptr();
            let from_box = TaskKey::from(boxed);
            for k in [&from_slice, &from_box] {
                assert_eq!(k.is_inline(), inline, "{len}");
                assert_eq!(k.as_bytes(), &bytes[..]);
                assert_eq!(&**k, &bytes[..]);
                assert_eq!(k.as_ref(), &bytes[..]);
                assert_eq!(format!("{k:?}"), format!("{:?}", &bytes[..]));
            }
            // Equal by bytes, however held.
            assert_eq!(from_slice, from_box);
            assert_eq!(from_slice, TaskKey::from(Box::<[u8]>::from(bytes.clone())));
            assert_ne!(from_slice, TaskKey::from(&b"other"[..]));
            // A long key keeps the allocation it came in.
            if !inline {
                assert_eq!(from_box.as_ptr(), heap_ptr);
            }
            assert_eq!(&*from_box.into_boxed(), &bytes[..]);
            assert_eq!(&*Box::<[u8]>::from(from_slice), &bytes[..]);
        }
    }

    fn live(key: &[u8], due_ms: u64) -> LiveTask {
        LiveTask {
            key: key.into(),
            payload: Box::default(),
            payload_at: None,
            due_ms,
            deliveries: 0,
            in_flight: false,
            last_error: Box::default(),
        }
    }

    #[test]
    fn checkpoint_tasks_follow_the_rules_once_records_come() {
        let base = vec![
            (4, live(b"a", 10)),
            (2, live(b"b", 20)),
            (7, live(b"c", 30)),
        ];
        let mut r = Replay::from_checkpoint(9, base, Vec::new(), true).unwrap();
        assert_eq!(r.live_tasks(), 3);
        // No table is built yet; the first record naming a task builds one.
        assert!(r.base_at.is_none() && r.keys.is_none());
        r.apply(&Record::Deliver {
            id: TaskId(2),
            fired_ms: 5,
        })
        .unwrap();
        assert!(r.base_at.is_some() && r.keys.is_none());
        r.apply(&Record::Retry {
            id: TaskId(2),
            due_ms: 25,
            error: b"e",
        })
        .unwrap();
        r.apply(&Record::Cancel { id: TaskId(4) }).unwrap();
        assert!(r.apply(&Record::Cancel { id: TaskId(4) }).is_err());
        assert!(
            r.apply(&Record::Ack { id: TaskId(7) }).is_err(),
            "not in flight"
        );
        // Key "c" is live (task 7), "a" was finished with task 4.
        assert!(r.apply(&schedule(10, b"c")).is_err());
        assert!(r.keys.is_some());
        r.apply(&schedule(10, b"a")).unwrap();
        assert!(r.apply(&schedule(11, b"a")).is_err());
        r.apply(&Record::Cancel { id: TaskId(10) }).unwrap();
        r.apply(&schedule(11, b"a")).unwrap();
        assert_eq!(r.live_tasks(), 3);
        let mut tasks: Vec<(u64, u64, u32, Vec<u8>)> = r
            .into_parts()
            .0
            .into_iter()
            .map(|(id, t)| (id, t.due_ms, t.deliveries, t.last_error.to_vec()))
            .collect();
        tasks.sort();
        assert_eq!(
            tasks,
            vec![
                (2, 25, 1, b"e".to_vec()),
                (7, 30, 0, Vec::new()),
                (11, 5, 0, Vec::new())
            ]
        );
    }

    #[test]
    fn a_checkpoint_key_twice_is_refused_when_the_keys_are_indexed() {
        let base = vec![(1, live(b"a", 10)), (2, live(b"a", 20))];
        let mut r = Replay::from_checkpoint(2, base.clone(), Vec::new(), true).unwrap();
        let e = r.apply(&schedule(3, b"z")).unwrap_err();
        assert!(e.0.contains("two live tasks have key"), "{e}");
        // What `kairos verify` asks for at once.
        let mut r = Replay::from_checkpoint(2, base.clone(), Vec::new(), false).unwrap();
        let e = r.build_tables().unwrap_err();
        assert!(e.0.contains("two live tasks have key"), "{e}");
        // Finishing one of them first makes the set consistent again.
        let mut r = Replay::from_checkpoint(2, base, Vec::new(), true).unwrap();
        r.apply(&Record::Cancel { id: TaskId(1) }).unwrap();
        r.apply(&schedule(3, b"z")).unwrap();
        assert_eq!(r.live_tasks(), 2);
    }

    #[test]
    fn a_checkpoint_id_twice_or_too_large_is_refused() {
        let base = vec![(1, live(b"a", 10)), (1, live(b"b", 20))];
        let mut r = Replay::from_checkpoint(2, base, Vec::new(), true).unwrap();
        let e = r.apply(&Record::Cancel { id: TaskId(1) }).unwrap_err();
        assert!(e.0.contains("listed twice"), "{e}");
        let base = vec![(3, live(b"a", 10))];
        let e = Replay::from_checkpoint(2, base, Vec::new(), true).unwrap_err();
        assert!(e.0.contains("exceeds the largest id"), "{e}");
    }

    #[test]
    fn checkpoint_tasks_are_found_with_dense_and_with_sparse_ids() {
        for ids in [[3u64, 4, 6], [1, 1 << 40, u64::MAX - 1]] {
            let base = ids
                .iter()
                .map(|&id| (id, live(format!("k{id}").as_bytes(), 10)))
                .collect();
            let mut r = Replay::from_checkpoint(u64::MAX - 1, base, Vec::new(), true).unwrap();
            r.apply(&Record::Cancel { id: TaskId(ids[1]) }).unwrap();
            let dense = matches!(r.base_at, Some(BaseIndex::Direct { .. }));
            assert_eq!(dense, ids[0] == 3, "{ids:?}");
            assert!(r.apply(&Record::Cancel { id: TaskId(ids[1]) }).is_err());
            assert!(r.apply(&Record::Cancel { id: TaskId(5) }).is_err());
            assert!(r.apply(&Record::Cancel { id: TaskId(0) }).is_err());
            r.apply(&Record::Deliver {
                id: TaskId(ids[2]),
                fired_ms: 5,
            })
            .unwrap();
            r.apply(&Record::Ack { id: TaskId(ids[2]) }).unwrap();
            assert_eq!(r.live_tasks(), 1);
            let (tasks, _) = r.into_parts();
            assert_eq!(
                tasks.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
                [ids[0]]
            );
        }
    }

    #[test]
    fn without_the_key_rule_no_key_table_is_built() {
        let base = vec![(1, live(b"a", 10))];
        let mut r = Replay::from_checkpoint(1, base, Vec::new(), true)
            .unwrap()
            .without_key_rule();
        // Key "a" is live: accepted all the same, and the table never built.
        r.apply(&schedule(2, b"a")).unwrap();
        r.apply(&Record::Cancel { id: TaskId(1) }).unwrap();
        r.build_tables().unwrap();
        assert!(r.keys.is_none());
        assert_eq!(r.live_tasks(), 1);
        // A schedule's id must still exceed every earlier one.
        assert!(r.apply(&schedule(2, b"b")).is_err());
    }
}
