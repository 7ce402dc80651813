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
