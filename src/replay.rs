//! Recovery's rules, in one place: rebuilding the live task set from the
//! engine's log records. The engine's open uses it (keeping payloads), and
//! `kairos verify` uses it to check a directory (keeping none). The rules are
//! specified in `wal/FORMAT.md`, "Kairos record bodies".

use crate::record::Record;
use std::collections::{HashMap, HashSet};

/// A task that is live after the records replayed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTask {
    /// Its key.
    pub key: Box<[u8]>,
    /// Its payload (empty when the replay keeps no payloads).
    pub payload: Box<[u8]>,
    /// Due time, UTC ms.
    pub due_ms: u64,
    /// Deliver records seen for it (0 = never delivered).
    pub deliveries: u32,
}

/// A record that breaks the replay rules: the log is not one the engine
/// wrote (or it was tampered with).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

/// The live task set, rebuilt record by record.
///
/// Memory: one entry per live task (its key, and its payload if kept).
#[derive(Debug, Default)]
pub struct Replay {
    tasks: HashMap<u64, LiveTask>,
    keys: HashSet<Box<[u8]>>,
    max_id: u64,
    keep_payloads: bool,
}

impl Replay {
    /// An empty replay; `keep_payloads` says whether live tasks keep their
    /// payload bytes (the engine needs them; a verifier does not).
    pub fn new(keep_payloads: bool) -> Replay {
        Replay {
            keep_payloads,
            ..Replay::default()
        }
    }

    /// Applies one record. On `Err` nothing changed.
    ///
    /// Rules: a schedule's id exceeds every earlier id and its key is not
    /// live; a cancel names a live task never delivered; a deliver names a
    /// live task; an ack names a live task delivered at least once.
    pub fn apply(&mut self, record: &Record<'_>) -> Result<(), RuleError> {
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
                if self.keys.contains(key) {
                    return Err(RuleError(format!(
                        "schedule of key {:?}, which is already live",
                        String::from_utf8_lossy(key)
                    )));
                }
                self.max_id = id.0;
                self.keys.insert(key.into());
                let payload = if self.keep_payloads { payload } else { &[] };
                self.tasks.insert(
                    id.0,
                    LiveTask {
                        key: key.into(),
                        payload: payload.into(),
                        due_ms,
                        deliveries: 0,
                    },
                );
            }
            Record::Cancel { id } => match self.tasks.get(&id.0) {
                Some(t) if t.deliveries == 0 => self.finish(id.0),
                Some(_) => return Err(rule("cancel", id.0, "which was already delivered")),
                None => return Err(rule("cancel", id.0, "which is not live")),
            },
            Record::Deliver { id, .. } => match self.tasks.get_mut(&id.0) {
                Some(t) => t.deliveries = t.deliveries.saturating_add(1),
                None => return Err(rule("deliver", id.0, "which is not live")),
            },
            Record::Ack { id } => match self.tasks.get(&id.0) {
                Some(t) if t.deliveries > 0 => self.finish(id.0),
                Some(_) => return Err(rule("ack", id.0, "which was never delivered")),
                None => return Err(rule("ack", id.0, "which is not live")),
            },
        }
        Ok(())
    }

    /// Live tasks so far.
    pub fn live(&self) -> usize {
        self.tasks.len()
    }

    /// The live tasks so far, in no particular order.
    pub fn tasks(&self) -> impl Iterator<Item = &LiveTask> {
        self.tasks.values()
    }

    /// The largest task id seen (0 if none).
    pub fn max_id(&self) -> u64 {
        self.max_id
    }

    /// The live tasks, by id.
    pub fn into_tasks(self) -> HashMap<u64, LiveTask> {
        self.tasks
    }

    fn finish(&mut self, id: u64) {
        if let Some(t) = self.tasks.remove(&id) {
            self.keys.remove(&t.key);
        }
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
        r.apply(&Record::Deliver {
            id: TaskId(1),
            fired_ms: 6,
        })
        .unwrap();
        assert!(
            r.apply(&Record::Cancel { id: TaskId(1) }).is_err(),
            "delivered"
        );
        r.apply(&Record::Ack { id: TaskId(1) }).unwrap();
        r.apply(&Record::Cancel { id: TaskId(2) }).unwrap();
        assert!(
            r.apply(&Record::Cancel { id: TaskId(2) }).is_err(),
            "not live"
        );
        assert_eq!(r.live(), 0);
        r.apply(&schedule(3, b"a")).unwrap();
        assert_eq!(r.max_id(), 3);
        let tasks = r.into_tasks();
        assert_eq!(tasks[&3].payload.as_ref(), b"p");
    }

    #[test]
    fn verifier_keeps_no_payloads() {
        let mut r = Replay::new(false);
        r.apply(&schedule(1, b"a")).unwrap();
        assert!(r.into_tasks()[&1].payload.is_empty());
    }
}
