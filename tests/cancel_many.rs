//! `cancel_many` against a model, at every engine size up to a few hundred
//! tasks: the index doubles along the way (and moves its entries to the
//! new table a few buckets per call), so some of these calls find their
//! keys in a table that is still being moved while earlier keys of the
//! same call are taken out. Every outcome is checked exactly, then the
//! index is checked to hold nothing stale: each key can be scheduled again,
//! and cancelled again one at a time.

mod common;

use common::{scaled, START_MS};
use kairos::{CancelOutcome, Config, Engine, ManualClock};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

fn key(i: usize) -> Vec<u8> {
    format!("order:{i:06}").into_bytes()
}

/// Schedules `n` keys (mixed delays, payloads in the entry and in the
/// arena), cancels a random share of them singly, then all `n` keys plus
/// absent ones and repeats through `cancel_many` in random batches.
fn check_size(n: usize, rng: &mut StdRng) {
    let clock = ManualClock::new(START_MS);
    let engine = Engine::in_memory(Config::default(), Arc::new(clock)).expect("in-memory engine");
    let payload = [9u8; 40];
    for i in 0..n {
        let delay = Duration::from_millis(1 + (i as u64 * 7_919) % 86_400_000);
        let payload: &[u8] = if i % 3 == 0 { &[] } else { &payload };
        engine
            .schedule_after(&key(i), delay, payload)
            .expect("schedule");
    }
    let mut live: HashSet<Vec<u8>> = (0..n).map(key).collect();
    for i in 0..n {
        if rng.random_bool(0.2) {
            assert_eq!(
                engine.cancel(&key(i)).expect("cancel"),
                CancelOutcome::Cancelled { deliveries: 0 },
                "size {n}: single cancel of key {i}"
            );
            live.remove(&key(i));
        }
    }
    // Every key, some twice, and some never scheduled, in random order.
    let mut keys: Vec<Vec<u8>> = (0..n).map(key).collect();
    for _ in 0..n / 8 + 1 {
        keys.push(key(rng.random_range(0..n.max(1))));
        keys.push(key(n + rng.random_range(0..1_000)));
    }
    keys.shuffle(rng);
    let mut rest = &keys[..];
    while !rest.is_empty() {
        let take = rng.random_range(1..=rest.len().min(200));
        let (batch, tail) = rest.split_at(take);
        rest = tail;
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        let outcomes = engine.cancel_many(&refs).expect("cancel_many");
        let expected: Vec<CancelOutcome> = batch
            .iter()
            .map(|k| {
                if live.remove(k) {
                    CancelOutcome::Cancelled { deliveries: 0 }
                } else {
                    CancelOutcome::NotFound
                }
            })
            .collect();
        assert_eq!(outcomes, expected, "size {n}: batch {batch:?}");
        let (entries, keyed) = engine.index_entries_accounted();
        assert_eq!(entries, keyed, "size {n}: index entries after a batch");
        assert_eq!(keyed, live.len(), "size {n}: tasks after a batch");
    }
    assert!(live.is_empty());
    let stats = engine.stats();
    assert_eq!((stats.scheduled, stats.pending), (0, 0), "size {n}");
    // Nothing stale in the index: every key is free again, and found again.
    for i in 0..n {
        engine
            .schedule_after(&key(i), Duration::from_secs(60), b"again")
            .unwrap_or_else(|e| panic!("size {n}: key {i} scheduled again: {e}"));
    }
    for i in (0..n).rev() {
        assert_eq!(
            engine.cancel(&key(i)).expect("cancel"),
            CancelOutcome::Cancelled { deliveries: 0 },
            "size {n}: key {i} cancelled again"
        );
    }
    assert_eq!(engine.stats().pending, 0, "size {n}");
}

#[test]
fn cancel_many_matches_a_model_at_every_size_while_the_index_grows() {
    let mut rng = StdRng::seed_from_u64(0x6b61_6972_6f73);
    for n in 0..=scaled(700, 5_000) {
        check_size(n, &mut rng);
    }
}
