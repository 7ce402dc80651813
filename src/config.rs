//! Engine configuration: every limit is a named constant with its unit last.

use crate::wheel::WHEEL_RANGE_TICKS;
use kairos_wal::Durability;
use std::time::Duration;

/// Default tick: the wheel's resolution. 1 ms (tokio, Linux at HZ=1000).
pub const TICK_DEFAULT: Duration = Duration::from_millis(1);
/// Coarsest tick accepted: one hour.
pub const TICK_MAX: Duration = Duration::from_secs(3600);
/// Default segment roll size of the write-ahead log: 64 MiB (etcd's choice).
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Default longest key, in bytes.
pub const KEY_BYTES_MAX_DEFAULT: usize = 1024;
/// Hard ceiling for [`Config::key_bytes_max`]: keys are stored with a 16-bit length.
pub const KEY_BYTES_MAX_LIMIT: usize = u16::MAX as usize;
/// Default largest payload, in bytes: 1 MiB.
pub const PAYLOAD_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// Hard ceiling for [`Config::payload_bytes_max`]: 16 MiB minus room for the
/// record's fixed fields and key, so one schedule always fits one log record.
pub const PAYLOAD_BYTES_MAX_LIMIT: usize = 16 * 1024 * 1024 - 128 * 1024;
/// Default largest number of live tasks (scheduled or delivered-unacked).
pub const PENDING_TASKS_MAX_DEFAULT: usize = 50_000_000;
/// Ceiling for [`Config::pending_tasks_max`]: 2^31 tasks (slots are `u32`,
/// and the wheel holds at most `u32::MAX` timers).
pub const PENDING_TASKS_LIMIT: usize = 1 << 31;
/// Default latest due time, relative to now: ten years (365-day years).
pub const DELAY_MAX_DEFAULT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Largest tasks in one `schedule_many` call (one log record batch).
pub const BATCH_TASKS_MAX: usize = 1_000_000;

/// How an engine is set up. Build with [`Config::default`] and adjust fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// Wheel resolution. Due times round *up* to a tick, so a task is never
    /// delivered early and at most one tick late (plus scheduling noise).
    /// Whole milliseconds, 1 ms..=[`TICK_MAX`]. Default [`TICK_DEFAULT`].
    pub tick: Duration,
    /// When a call returns relative to its record reaching stable storage.
    /// Default [`Durability::Sync`]. Ignored by in-memory engines.
    pub durability: Durability,
    /// Log segment roll size in bytes. Default [`SEGMENT_BYTES_DEFAULT`].
    pub segment_bytes: u64,
    /// Longest key accepted, in bytes (1..=[`KEY_BYTES_MAX_LIMIT`]).
    pub key_bytes_max: usize,
    /// Largest payload accepted, in bytes (≤ [`PAYLOAD_BYTES_MAX_LIMIT`]).
    pub payload_bytes_max: usize,
    /// Largest number of live tasks; `schedule` beyond it is an error.
    pub pending_tasks_max: usize,
    /// Latest due time accepted, relative to now. Must fit the wheel:
    /// at most `tick × 2^41` (half the wheel's range; ≈ 69 years at 1 ms).
    pub delay_max: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            tick: TICK_DEFAULT,
            durability: Durability::Sync,
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            key_bytes_max: KEY_BYTES_MAX_DEFAULT,
            payload_bytes_max: PAYLOAD_BYTES_MAX_DEFAULT,
            pending_tasks_max: PENDING_TASKS_MAX_DEFAULT,
            delay_max: DELAY_MAX_DEFAULT,
        }
    }
}

impl Config {
    /// The tick in whole milliseconds.
    pub(crate) fn tick_ms(&self) -> u64 {
        // validate() caps the tick at TICK_MAX, so this never saturates.
        u64::try_from(self.tick.as_millis()).unwrap_or(u64::MAX)
    }

    /// Checks every field; the error names the first bad one.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.tick < Duration::from_millis(1)
            || self.tick > TICK_MAX
            || !self.tick.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(format!(
                "tick must be a whole number of milliseconds in 1 ms..=1 h, got {:?}",
                self.tick
            ));
        }
        if self.key_bytes_max == 0 || self.key_bytes_max > KEY_BYTES_MAX_LIMIT {
            return Err(format!(
                "key_bytes_max must be in 1..={KEY_BYTES_MAX_LIMIT}, got {}",
                self.key_bytes_max
            ));
        }
        if self.payload_bytes_max > PAYLOAD_BYTES_MAX_LIMIT {
            return Err(format!(
                "payload_bytes_max must be ≤ {PAYLOAD_BYTES_MAX_LIMIT}, got {}",
                self.payload_bytes_max
            ));
        }
        if self.pending_tasks_max == 0 || self.pending_tasks_max > PENDING_TASKS_LIMIT {
            return Err(format!(
                "pending_tasks_max must be in 1..={PENDING_TASKS_LIMIT}, got {}",
                self.pending_tasks_max
            ));
        }
        // Half the wheel's range: the other half absorbs driver lag.
        let wheel_range_ms = u128::from(WHEEL_RANGE_TICKS / 2) * u128::from(self.tick_ms());
        if self.delay_max.as_millis() > wheel_range_ms {
            return Err(format!(
                "delay_max {:?} exceeds the wheel's range of {wheel_range_ms} ms at this tick",
                self.delay_max
            ));
        }
        if self.segment_bytes < kairos_wal::SEGMENT_BYTES_MIN {
            return Err(format!(
                "segment_bytes must be ≥ {}, got {}",
                kairos_wal::SEGMENT_BYTES_MIN,
                self.segment_bytes
            ));
        }
        Ok(())
    }
}
