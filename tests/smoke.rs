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
