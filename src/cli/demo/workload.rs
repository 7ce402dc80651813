//! The demo's workload: the order-timeout mix of `DESIGN.md`.
//!
//! Every task is derived from the run's seed and its index alone, so any
//! thread can recompute a task's key, delay, payment and payload without
//! shared state: producers to build it, consumers to check what arrived.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// End of the short class: 30 minutes, in seconds of simulated time.
const SHORT_MAX_S: f64 = 30.0 * 60.0;
/// End of the medium class: 7 days.
const MEDIUM_MAX_S: f64 = 7.0 * 86_400.0;
/// The far tail is capped at 30 days.
pub const LONG_MAX_S: f64 = 30.0 * 86_400.0;
/// Share of tasks due within 30 minutes.
const SHORT_SHARE: f64 = 0.45;
/// Share of tasks due between 30 minutes and 7 days.
const MEDIUM_SHARE: f64 = 0.35;
/// Share of short orders paid (cancelled) before their timeout.
const SHORT_PAID_SHARE: f64 = 0.65;
/// Share of medium and long orders paid before their timeout.
const OTHER_PAID_SHARE: f64 = 0.30;
/// Smallest payload, bytes.
const PAYLOAD_MIN_BYTES: usize = 50;
/// Largest payload, bytes.
const PAYLOAD_MAX_BYTES: usize = 500;
/// Order numbers start here, so keys have a fixed width of 8 digits
/// (`order:10000042:timeout`, 22 bytes).
const ORDER_BASE: u64 = 10_000_000;
/// Share of tasks whose first delivery fails (nacked, retried, then acked).
pub const FAIL_FIRST_SHARE: f64 = 0.01;
/// Share of tasks that fail every delivery (poison): dead-lettered after
/// `RetryPolicy::max_attempts` deliveries.
pub const POISON_SHARE: f64 = 0.001;
/// Salt of the draw that decides a task's [`Fate`], apart from its spec.
const FATE_SALT: u64 = 0x5EED_FA7E_0000_0001;
const KEY_PREFIX: &str = "order:";
const KEY_SUFFIX: &str = ":timeout";

/// The workload of one run: how many tasks, the time scale, the seed.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Number of tasks (orders).
    pub tasks: u32,
    /// Simulated seconds per real second.
    pub time_scale: f64,
    /// Seed every task is derived from.
    pub seed: u64,
}

/// One order's timeout task, as derived from the seed.
#[derive(Debug, Clone, Copy)]
pub struct TaskSpec {
    /// Real-time delay until the timeout (simulated delay / time scale).
    pub delay: Duration,
    /// If the order is paid: how long after scheduling the cancel is planned
    /// (always before `delay`).
    pub paid_after: Option<Duration>,
    /// Payload length, bytes.
    pub payload_bytes: usize,
}

/// What the consumers do with a task's deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Every delivery succeeds (acked).
    Succeed,
    /// The first delivery fails (nacked with a short retry); later ones succeed.
    FailFirst,
    /// Every delivery fails: the task ends as a dead letter.
    Poison,
}

impl Workload {
    /// The real-time span covering every due time: 30 days scaled.
    pub fn span(&self) -> Duration {
        Duration::from_secs_f64(LONG_MAX_S / self.time_scale)
    }

    /// The task at `index`: its class (45 / 35 / 20 %), a delay uniform
    /// within the class, whether it is paid, and its payload size.
    pub fn spec(&self, index: u32) -> TaskSpec {
        let mut rng = SmallRng::seed_from_u64(mix(self.seed, index));
        let class: f64 = rng.random();
        let (low_s, high_s, paid_share) = if class < SHORT_SHARE {
            (0.0, SHORT_MAX_S, SHORT_PAID_SHARE)
        } else if class < SHORT_SHARE + MEDIUM_SHARE {
            (SHORT_MAX_S, MEDIUM_MAX_S, OTHER_PAID_SHARE)
        } else {
            (MEDIUM_MAX_S, LONG_MAX_S, OTHER_PAID_SHARE)
        };
        // `1 − u` for u in [0, 1) lies in (0, 1]: the interval (low, high].
        let simulated_s = high_s - rng.random::<f64>() * (high_s - low_s);
        let delay = Duration::from_secs_f64(simulated_s / self.time_scale);
        let paid = rng.random::<f64>() < paid_share;
        let paid_after = paid.then(|| delay.mul_f64(rng.random::<f64>()));
        let payload_bytes = rng.random_range(PAYLOAD_MIN_BYTES..=PAYLOAD_MAX_BYTES);
        TaskSpec {
            delay,
            paid_after,
            payload_bytes,
        }
    }

    /// The task's fate: [`POISON_SHARE`] poison, [`FAIL_FIRST_SHARE`] failing
    /// once, the rest succeeding. Drawn apart from [`Workload::spec`], so the
    /// delays and payments of a seed do not depend on it.
    pub fn fate(&self, index: u32) -> Fate {
        // 53 random bits as a share in [0, 1).
        let u = (mix(self.seed ^ FATE_SALT, index) >> 11) as f64 / (1u64 << 53) as f64;
        if u < POISON_SHARE {
            Fate::Poison
        } else if u < POISON_SHARE + FAIL_FIRST_SHARE {
            Fate::FailFirst
        } else {
            Fate::Succeed
        }
    }

    /// The key of the task at `index`: `order:<8 digits>:timeout`.
    pub fn key(&self, index: u32) -> String {
        format!("{KEY_PREFIX}{}{KEY_SUFFIX}", ORDER_BASE + u64::from(index))
    }

    /// The index of the task with `key`, if it is one of this run's keys.
    pub fn index_of(&self, key: &[u8]) -> Option<u32> {
        let key = std::str::from_utf8(key).ok()?;
        let digits = key.strip_prefix(KEY_PREFIX)?.strip_suffix(KEY_SUFFIX)?;
        let order: u64 = digits.parse().ok()?;
        let index = u32::try_from(order.checked_sub(ORDER_BASE)?).ok()?;
        (index < self.tasks).then_some(index)
    }

    /// The payload of the task at `index`: a readable header and filler
    /// letters derived from the seed, `spec.payload_bytes` long.
    pub fn payload(&self, index: u32, spec: &TaskSpec) -> Vec<u8> {
        let mut out = Vec::with_capacity(spec.payload_bytes);
        let header = format!(
            "order={};action=cancel-unpaid;pad=",
            ORDER_BASE + u64::from(index)
        );
        out.extend_from_slice(header.as_bytes());
        out.truncate(spec.payload_bytes);
        let mut state = mix(self.seed ^ 0xA5A5_A5A5, index);
        while out.len() < spec.payload_bytes {
            state = splitmix64(state);
            out.push(b'a' + (state % 26) as u8);
        }
        out
    }
}

/// A 64-bit seed for task `index` of a run seeded with `seed`.
pub fn mix(seed: u64, index: u32) -> u64 {
    splitmix64(seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// SplitMix64's output function (Steele, Lea & Flood 2014).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> Workload {
        Workload {
            tasks: 100_000,
            time_scale: 86_400.0,
            seed: 7,
        }
    }

    #[test]
    fn keys_round_trip_and_foreign_keys_are_refused() {
        let w = workload();
        assert_eq!(w.key(42), "order:10000042:timeout");
        assert_eq!(w.index_of(w.key(42).as_bytes()), Some(42));
        assert_eq!(w.index_of(w.key(100_000).as_bytes()), None);
        assert_eq!(w.index_of(b"order:42:timeout"), None);
        assert_eq!(w.index_of(b"other"), None);
    }

    #[test]
    fn mix_matches_the_design_shares() {
        let w = workload();
        let (mut short, mut medium, mut paid_short) = (0u32, 0u32, 0u32);
        for i in 0..w.tasks {
            let spec = w.spec(i);
            let simulated_s = spec.delay.as_secs_f64() * w.time_scale;
            assert!(simulated_s > 0.0 && simulated_s <= LONG_MAX_S + 1e-6);
            if let Some(after) = spec.paid_after {
                assert!(after < spec.delay);
            }
            if simulated_s <= SHORT_MAX_S {
                short += 1;
                paid_short += u32::from(spec.paid_after.is_some());
            } else if simulated_s <= MEDIUM_MAX_S {
                medium += 1;
            }
            let payload = w.payload(i, &spec);
            assert_eq!(payload.len(), spec.payload_bytes);
            assert!((PAYLOAD_MIN_BYTES..=PAYLOAD_MAX_BYTES).contains(&payload.len()));
        }
        let share = |n: u32| f64::from(n) / f64::from(w.tasks);
        assert!((share(short) - SHORT_SHARE).abs() < 0.01);
        assert!((share(medium) - MEDIUM_SHARE).abs() < 0.01);
        assert!((f64::from(paid_short) / f64::from(short) - SHORT_PAID_SHARE).abs() < 0.02);
    }

    #[test]
    fn fates_match_their_shares() {
        let w = workload();
        let (mut fail_first, mut poison) = (0u32, 0u32);
        for i in 0..w.tasks {
            match w.fate(i) {
                Fate::FailFirst => fail_first += 1,
                Fate::Poison => poison += 1,
                Fate::Succeed => {}
            }
        }
        let share = |n: u32| f64::from(n) / f64::from(w.tasks);
        assert!((share(fail_first) - FAIL_FIRST_SHARE).abs() < 0.002);
        assert!((share(poison) - POISON_SHARE).abs() < 0.0005);
    }
}
