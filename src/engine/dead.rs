//! The engine's dead letters in memory: by task id, in id order, with the
//! bytes of their payloads counted as they come and go — so that
//! [`crate::Engine::stats`] reads that figure in O(1) and a page of
//! [`crate::Engine::dead_letters_after`] costs O(log D + page), not a pass
//! over every dead letter under the engine's lock.

use crate::replay::DeadTask;
use std::collections::BTreeMap;

/// Dead letters by task id (see the module docs).
#[derive(Debug, Default)]
pub(super) struct DeadLetters {
    by_id: BTreeMap<u64, DeadTask>,
    /// The sum of `payload.len()` over `by_id`.
    payload_bytes: usize,
}

impl DeadLetters {
    /// Adds (or replaces) dead letter `id`. O(log D).
    pub(super) fn insert(&mut self, id: u64, task: DeadTask) {
        self.payload_bytes += task.payload.len();
        if let Some(old) = self.by_id.insert(id, task) {
            self.payload_bytes -= old.payload.len();
        }
    }

    /// Takes dead letter `id` out, if there is one. O(log D).
    pub(super) fn remove(&mut self, id: u64) -> Option<DeadTask> {
        let task = self.by_id.remove(&id)?;
        self.payload_bytes -= task.payload.len();
        Some(task)
    }

    /// Dead letter `id`. O(log D).
    pub(super) fn get(&self, id: u64) -> Option<&DeadTask> {
        self.by_id.get(&id)
    }

    /// Whether dead letter `id` is here. O(log D).
    pub(super) fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Gives dead letter `id` the payload `payload` (read back from disk);
    /// whether there is such a dead letter. O(log D).
    pub(super) fn set_payload(&mut self, id: u64, payload: Box<[u8]>) -> bool {
        let Some(task) = self.by_id.get_mut(&id) else {
            return false;
        };
        self.payload_bytes -= task.payload.len();
        self.payload_bytes += payload.len();
        task.payload = payload;
        true
    }

    /// How many dead letters there are.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The bytes of all their payloads. O(1).
    pub(super) fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }

    /// Their ids, ascending.
    pub(super) fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_id.keys().copied()
    }

    /// The dead letters with ids above `after`, ascending. O(log D) to the
    /// first.
    pub(super) fn after(&self, after: u64) -> impl Iterator<Item = (u64, &DeadTask)> + '_ {
        use std::ops::Bound::{Excluded, Unbounded};
        self.by_id
            .range((Excluded(after), Unbounded))
            .map(|(&id, t)| (id, t))
    }
}

impl FromIterator<(u64, DeadTask)> for DeadLetters {
    fn from_iter<I: IntoIterator<Item = (u64, DeadTask)>>(iter: I) -> Self {
        let mut out = Self::default();
        for (id, task) in iter {
            out.insert(id, task);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dead(payload_len: usize) -> DeadTask {
        DeadTask {
            key: b"k".as_slice().into(),
            payload: vec![7; payload_len].into(),
            due_ms: 1,
            deliveries: 1,
            dead_ms: 2,
            error: Box::default(),
        }
    }

    /// The payload byte count follows every change, against a sum over
    /// the map; pages come in id order from just above `after`.
    #[test]
    fn payload_bytes_and_pages_follow_every_change() {
        let mut d: DeadLetters = [(5, dead(10)), (1, dead(3))].into_iter().collect();
        let sum = |d: &DeadLetters| d.by_id.values().map(|t| t.payload.len()).sum::<usize>();
        assert_eq!((d.payload_bytes(), d.len()), (13, 2));
        d.insert(9, dead(100));
        d.insert(5, dead(4)); // replaces 10 bytes with 4
        assert_eq!(d.payload_bytes(), 107);
        assert!(d.set_payload(1, vec![1; 20].into()));
        assert!(!d.set_payload(2, vec![1; 20].into()));
        assert_eq!(d.payload_bytes(), 124);
        assert_eq!(d.remove(9).map(|t| t.payload.len()), Some(100));
        assert_eq!(d.remove(9).map(|t| t.payload.len()), None);
        assert_eq!(d.payload_bytes(), sum(&d));
        assert_eq!(d.payload_bytes(), 24);
        for id in 10..20 {
            d.insert(id, dead(id as usize));
        }
        assert_eq!(d.payload_bytes(), sum(&d));
        let page: Vec<u64> = d.after(5).take(3).map(|(id, _)| id).collect();
        assert_eq!(page, [10, 11, 12]);
        let all: Vec<u64> = d.after(0).map(|(id, _)| id).collect();
        assert_eq!(all, d.ids().collect::<Vec<_>>());
        assert_eq!(all.first(), Some(&1));
        assert!(d.contains(19) && !d.contains(20));
        assert_eq!(d.get(5).map(|t| t.payload.len()), Some(4));
    }
}
