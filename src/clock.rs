//! Time sources. All time enters Kairos through [`Clock`], so tests can drive
//! a [`ManualClock`] and run months of simulated time in milliseconds.
//!
//! Two readings are kept apart, as tokio's timer and Netty's switch to
//! `nanoTime` taught: *wall* time (UTC, used to map absolute due times and
//! stored on disk) and *monotonic* time (drives firing, never goes back).

use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of wall and monotonic time.
///
/// Implementations must be cheap to call (the driver reads the clock on every
/// wake-up) and must never panic.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Current wall-clock time (UTC). May jump forwards or backwards.
    fn now_wall(&self) -> SystemTime;

    /// Monotonic time since an arbitrary fixed origin. Never decreases.
    fn now_monotonic(&self) -> Duration;

    /// Both readings at once. The default reads them one after the other;
    /// a clock that can take both more cheaply (one lock) overrides it.
    fn now_wall_and_monotonic(&self) -> (SystemTime, Duration) {
        (self.now_wall(), self.now_monotonic())
    }

    /// `true` if time only moves when a test moves it. The driver then waits
    /// for [`Clock::register_waker`] notifications instead of real timeouts.
    fn is_manual(&self) -> bool {
        false
    }

    /// Asks to be woken whenever the clock is moved by hand. Real clocks
    /// ignore it (the default).
    fn register_waker(&self, waker: Waker) {
        let _ = waker;
    }

    /// Forgets a waker registered with [`Clock::register_waker`] (an engine
    /// calls it when it stops). Real clocks ignore it (the default).
    fn unregister_waker(&self, waker: &Waker) {
        let _ = waker;
    }
}

/// The operating system's clocks: [`SystemTime`] and [`Instant`].
#[derive(Debug, Clone)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A system clock whose monotonic origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_wall(&self) -> SystemTime {
        SystemTime::now()
    }

    fn now_monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
}

#[derive(Debug)]
struct ManualState {
    wall: SystemTime,
    monotonic: Duration,
    wakers: Vec<Waker>,
}

/// A clock that moves only when told to. Cloning shares the same time.
///
/// [`ManualClock::advance`] moves wall and monotonic time together;
/// [`ManualClock::step_wall`] moves only the wall clock (an NTP or operator
/// step); [`ManualClock::advance_monotonic`] moves only monotonic time.
/// Every move wakes the engines using the clock; follow it with
/// `Engine::run_until_idle` to wait until they have handed out what fell due.
///
/// What the clock drives: due times, firing, leases, retry backoffs, the
/// catch-up rate. What still runs on real time in an engine using it: the
/// background fdatasync of `Durability::Interval`,
/// [`Config::checkpoint_interval`](crate::Config::checkpoint_interval),
/// `Consumer::recv_timeout`, the rounds of the payload prefetcher
/// ([`Config::payload_prefetch`](crate::Config::payload_prefetch)) and the
/// log's idle mark ([`Config::synced_mark_delay`](crate::Config::synced_mark_delay)).
/// A deterministic test turns off what it does not want
/// (`checkpoint_interval = None`, `payload_prefetch = false`) and calls
/// `Engine::sync` or `Engine::checkpoint` itself.
#[derive(Clone)]
pub struct ManualClock {
    state: Arc<Mutex<ManualState>>,
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.lock();
        f.debug_struct("ManualClock")
            .field("wall", &s.wall)
            .field("monotonic", &s.monotonic)
            .finish()
    }
}

impl ManualClock {
    /// A manual clock whose wall time is `wall_ms` milliseconds after the Unix
    /// epoch and whose monotonic time is zero.
    pub fn new(wall_ms: u64) -> Self {
        ManualClock {
            state: Arc::new(Mutex::new(ManualState {
                wall: UNIX_EPOCH + Duration::from_millis(wall_ms),
                monotonic: Duration::ZERO,
                wakers: Vec::new(),
            })),
        }
    }

    /// Moves wall and monotonic time forward by `by`.
    ///
    /// # Panics
    /// If either time would overflow (`SystemTime + by`, `Duration + by`: a
    /// `by` near `Duration::MAX`, far beyond any due time the engine
    /// accepts). The clock is left unchanged and stays usable.
    pub fn advance(&self, by: Duration) {
        self.update(|s| {
            let (Some(wall), Some(monotonic)) =
                (s.wall.checked_add(by), s.monotonic.checked_add(by))
            else {
                panic!("ManualClock::advance({by:?}) overflows the clock");
            };
            s.wall = wall;
            s.monotonic = monotonic;
        });
    }

    /// Moves only monotonic time forward by `by` (as across a suspend that the
    /// wall clock did not see).
    ///
    /// # Panics
    /// If monotonic time would overflow `Duration` (as [`ManualClock::advance`]);
    /// the clock is left unchanged.
    pub fn advance_monotonic(&self, by: Duration) {
        self.update(|s| {
            let Some(monotonic) = s.monotonic.checked_add(by) else {
                panic!("ManualClock::advance_monotonic({by:?}) overflows the clock");
            };
            s.monotonic = monotonic;
        });
    }

    /// Steps only the wall clock by `delta_ms` milliseconds (negative: back).
    /// Saturates at the Unix epoch.
    ///
    /// # Panics
    /// If wall time would overflow `SystemTime` (only after steps adding up to
    /// hundreds of billions of years: one step is at most ~292 million).
    pub fn step_wall(&self, delta_ms: i64) {
        self.update(|s| {
            let d = Duration::from_millis(delta_ms.unsigned_abs());
            s.wall = if delta_ms >= 0 {
                let Some(wall) = s.wall.checked_add(d) else {
                    panic!("ManualClock::step_wall({delta_ms}) overflows the clock");
                };
                wall
            } else {
                // `SystemTime` reaches before the epoch on Unix: `checked_sub`
                // alone would not saturate.
                s.wall
                    .checked_sub(d)
                    .filter(|wall| *wall >= UNIX_EPOCH)
                    .unwrap_or(UNIX_EPOCH)
            };
        });
    }

    /// Current wall time in milliseconds since the Unix epoch.
    pub fn wall_ms(&self) -> u64 {
        system_time_to_ms(self.state.lock().wall).unwrap_or(0)
    }

    fn update(&self, f: impl FnOnce(&mut ManualState)) {
        let wakers = {
            let mut s = self.state.lock();
            f(&mut s);
            s.wakers.clone()
        };
        // Wake outside our lock: wakers take engine locks that may in turn
        // read this clock.
        for w in wakers {
            w.wake();
        }
    }
}

impl Clock for ManualClock {
    fn now_wall(&self) -> SystemTime {
        self.state.lock().wall
    }

    fn now_monotonic(&self) -> Duration {
        self.state.lock().monotonic
    }

    fn now_wall_and_monotonic(&self) -> (SystemTime, Duration) {
        let s = self.state.lock();
        (s.wall, s.monotonic)
    }

    fn is_manual(&self) -> bool {
        true
    }

    fn register_waker(&self, waker: Waker) {
        let mut s = self.state.lock();
        s.wakers.retain(|w| !w.will_wake(&waker));
        s.wakers.push(waker);
    }

    fn unregister_waker(&self, waker: &Waker) {
        self.state.lock().wakers.retain(|w| !w.will_wake(waker));
    }
}

/// Milliseconds since the Unix epoch, or `None` for a time before it or past
/// `u64::MAX` ms.
pub fn system_time_to_ms(t: SystemTime) -> Option<u64> {
    let d = t.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(d.as_millis()).ok()
}

/// Nanoseconds since the Unix epoch as a signed 128-bit value (negative before
/// the epoch). Never fails.
pub(crate) fn system_time_to_ns(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i128,
        Err(e) => -(e.duration().as_nanos() as i128),
    }
}

/// The [`SystemTime`] `ms` milliseconds after the Unix epoch.
pub fn ms_to_system_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.wall_ms(), 1_000);
        assert_eq!(c.now_monotonic(), Duration::ZERO);
        c.advance(Duration::from_millis(250));
        assert_eq!(c.wall_ms(), 1_250);
        assert_eq!(c.now_monotonic(), Duration::from_millis(250));
        c.step_wall(-2_000);
        assert_eq!(c.wall_ms(), 0);
        assert_eq!(c.now_monotonic(), Duration::from_millis(250));
        c.advance_monotonic(Duration::from_millis(5));
        assert_eq!(c.now_monotonic(), Duration::from_millis(255));
    }

    /// A step back past the epoch stops there, as documented: the wall clock
    /// reads the epoch, not a time before it (which `wall_ms` would show as 0
    /// while the engine saw a pre-epoch wall time), and a step forward then
    /// counts from the epoch.
    #[test]
    fn a_step_back_past_the_epoch_saturates_there() {
        let c = ManualClock::new(1_000);
        c.step_wall(-2_000);
        assert_eq!(c.now_wall(), UNIX_EPOCH);
        c.step_wall(500);
        assert_eq!(c.wall_ms(), 500);
        c.step_wall(i64::MIN);
        assert_eq!(c.now_wall(), UNIX_EPOCH);
    }

    #[test]
    fn an_overflowing_advance_panics_and_leaves_the_clock_as_it_was() {
        let c = ManualClock::new(1_000);
        c.advance(Duration::from_millis(7));
        for step in [
            |c: &ManualClock| c.advance(Duration::MAX),
            |c: &ManualClock| c.advance_monotonic(Duration::MAX),
        ] {
            let moved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(&c)));
            assert!(moved.is_err());
            assert_eq!(c.wall_ms(), 1_007);
            assert_eq!(c.now_monotonic(), Duration::from_millis(7));
        }
        c.advance(Duration::from_millis(1));
        assert_eq!(c.wall_ms(), 1_008);
    }

    struct CountingWaker(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn manual_clock_wakes_registered_wakers_until_unregistered() {
        let c = ManualClock::new(0);
        let count = Arc::new(CountingWaker(Default::default()));
        let waker = Waker::from(Arc::clone(&count));
        c.register_waker(waker.clone());
        c.register_waker(waker.clone()); // the same waker once
        c.advance(Duration::from_millis(1));
        c.step_wall(5);
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 2);
        c.unregister_waker(&waker);
        c.advance(Duration::from_millis(1));
        assert_eq!(count.0.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(c.state.lock().wakers.is_empty());
    }

    #[test]
    fn time_conversions_round_trip() {
        assert_eq!(system_time_to_ms(ms_to_system_time(42)), Some(42));
        assert_eq!(
            system_time_to_ms(UNIX_EPOCH - Duration::from_millis(1)),
            None
        );
        assert_eq!(system_time_to_ns(UNIX_EPOCH - Duration::from_nanos(5)), -5);
    }
}
