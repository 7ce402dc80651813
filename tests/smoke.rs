use kairos::{CancelOutcome, Config, Engine, ManualClock, RecvError};
use std::sync::Arc;
use std::time::Duration;

#[test]
fn in_memory_schedule_cancel_fire() -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    engine.schedule_after(b"a", Duration::from_millis(10), b"pa")?;
    engine.schedule_after(b"b", Duration::from_millis(5), b"pb")?;
    engine.schedule_after(b"c", Duration::from_millis(5), b"pc")?;
    assert_eq!(
        engine.cancel(b"c")?,
        CancelOutcome::Cancelled { deliveries: 0 }
    );
    assert_eq!(engine.cancel(b"c")?, CancelOutcome::NotFound);
    let consumer = engine.consumer();
    clock.advance(Duration::from_millis(4));
    engine.run_until_idle();
    assert_eq!(consumer.try_recv().unwrap_err(), RecvError::Empty);
    clock.advance(Duration::from_millis(1));
    engine.run_until_idle();
    let d = consumer.try_recv()?;
    assert_eq!(d.key(), b"b");
    assert_eq!(d.payload(), b"pb");
    assert_eq!(
        engine.cancel(b"b")?,
        CancelOutcome::AlreadyDelivered { attempt: 1 }
    );
    consumer.ack(&d)?;
    assert_eq!(engine.cancel(b"b")?, CancelOutcome::NotFound);
    clock.advance(Duration::from_secs(400 * 86_400));
    engine.run_until_idle();
    assert_eq!(consumer.try_recv()?.key(), b"a");
    engine.shutdown()?;
    assert_eq!(consumer.recv().unwrap_err(), RecvError::Closed);
    Ok(())
}

/// The idle high-water mark on a real disk: `Config::synced_mark_delay` reaches the log,
/// whose writer records in `wal/SYNCED` how far it synced once appends pause.
#[test]
fn an_idle_engine_records_its_synced_position_on_disk() -> Result<(), Box<dyn std::error::Error>> {
    use kairos_wal::format::{Synced, SYNCED_FILE_NAME};
    let synced_path = |dir: &std::path::Path| dir.join("wal").join(SYNCED_FILE_NAME);
    let dir = tempfile::tempdir()?;
    let engine = Engine::open(dir.path(), Config::default())?;
    engine.schedule_after(b"order:1", Duration::from_secs(3600), b"p")?;
    // The writer's own timer (10 ms after the sync): poll, with a generous bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let synced = loop {
        if let Ok(bytes) = std::fs::read(synced_path(dir.path())) {
            let synced = Synced::decode(&bytes)?;
            if synced.synced_lsn.0 >= 1 {
                break synced;
            }
        }
        assert!(std::time::Instant::now() < deadline, "no SYNCED written");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert_eq!(synced.seq, 1);
    engine.shutdown()?;

    // Turned off (and proof before acknowledgement, which records a new log's first segment
    // there): never written.
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    config.synced_mark_delay = None;
    config.proof_before_ack = false;
    let engine = Engine::open(dir.path(), config)?;
    engine.schedule_after(b"order:1", Duration::from_secs(3600), b"p")?;
    std::thread::sleep(Duration::from_millis(100));
    assert!(!synced_path(dir.path()).exists());
    engine.shutdown()?;

    // Over the limit: refused.
    let mut config = Config::default();
    config.synced_mark_delay = Some(kairos_wal::SYNCED_MARK_DELAY_MAX + Duration::from_secs(1));
    assert!(Engine::open(dir.path(), config).is_err());
    Ok(())
}

/// Keys and payloads of every size class — in the task's entry (≤ 26
/// bytes together), in the payload arena (27 B–1 KiB) and in an allocation
/// of their own (over 1 KiB) — through `schedule`, `schedule_many`,
/// `reschedule` (new payload, and upsert) and cancel: each delivered task
/// carries exactly its bytes, and `payload_bytes_in_memory` counts them.
#[test]
fn payloads_of_every_size_keep_their_bytes() -> Result<(), Box<dyn std::error::Error>> {
    use kairos::{Due, NewTask};
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone()))?;
    let payload = |n: usize, fill: u8| -> Vec<u8> { (0..n).map(|i| fill ^ (i as u8)).collect() };
    let sizes = [0usize, 1, 20, 21, 60, 1000, 1001, 1024, 3000];
    let mut want = std::collections::BTreeMap::new();
    for (i, &n) in sizes.iter().enumerate() {
        let key = format!("one:{i}");
        let p = payload(n, 1);
        engine.schedule_after(key.as_bytes(), Duration::from_millis(10 + i as u64), &p)?;
        want.insert(key.into_bytes(), p);
    }
    let keys: Vec<String> = (0..sizes.len()).map(|i| format!("many:{i}")).collect();
    let payloads: Vec<Vec<u8>> = sizes.iter().map(|&n| payload(n, 2)).collect();
    let batch: Vec<NewTask<'_>> = keys
        .iter()
        .zip(&payloads)
        .map(|(k, p)| NewTask {
            key: k.as_bytes(),
            due: Due::After(Duration::from_millis(20)),
            payload: p,
        })
        .collect();
    engine.schedule_many(&batch)?;
    for (k, p) in keys.iter().zip(&payloads) {
        want.insert(k.clone().into_bytes(), p.clone());
    }
    // New payloads of other sizes for some; an upsert of a new key.
    for (i, &n) in sizes.iter().rev().enumerate().step_by(2) {
        let key = format!("one:{i}");
        let p = payload(n, 3);
        engine.reschedule(
            key.as_bytes(),
            Due::After(Duration::from_millis(30)),
            Some(&p),
        )?;
        want.insert(key.into_bytes(), p);
    }
    let big = payload(2000, 4);
    engine.reschedule(b"upsert", Due::After(Duration::from_millis(5)), Some(&big))?;
    want.insert(b"upsert".to_vec(), big);
    for k in ["one:1", "many:8", "many:5"] {
        assert!(matches!(
            engine.cancel(k.as_bytes())?,
            CancelOutcome::Cancelled { .. }
        ));
        want.remove(k.as_bytes());
    }
    let in_memory: usize = want.values().map(Vec::len).sum();
    assert_eq!(engine.stats().payload_bytes_in_memory, in_memory);
    let consumer = engine.consumer();
    clock.advance(Duration::from_millis(40));
    engine.run_until_idle();
    let mut got = std::collections::BTreeMap::new();
    while let Ok(d) = consumer.try_recv() {
        got.insert(d.key().to_vec(), d.payload().to_vec());
        consumer.ack(&d)?;
    }
    assert_eq!(got, want);
    assert_eq!(engine.stats().payload_bytes_in_memory, 0);
    Ok(())
}
