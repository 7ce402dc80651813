//! # Kairos — an embeddable, durable delayed-task engine
//!
//! Schedule a task to fire at a moment in the future, cancel it by key in
//! O(1) before then, and receive it on consumer threads when it falls due.
//! Kairos runs inside your process, like SQLite: a hierarchical timing wheel
//! (Varghese & Lauck 1987, scheme 7) holds the tasks due soon — by default
//! within a minute ([`Config::resident_window`]) — and a tombstone index maps
//! keys to them; tasks due later are *far* tasks, kept on disk in overflow
//! files sorted by due time ([`overflow`]) with only a 20-byte entry in
//! memory ([`far`]), and promoted into the wheel ahead of their due time;
//! payloads of tasks not due soon stay on disk too. Every state change is a
//! record in a segmented write-ahead log ([`kairos_wal`]), written before it
//! takes effect; when the record is on stable storage depends on the
//! [`Durability`] mode (`Sync`: before the call returns). Checkpoints
//! ([`Engine::checkpoint`], also taken in the background) let recovery skip
//! history and old log segments be deleted. [`Engine::in_memory`] writes
//! nothing.
//!
//! ```
//! use kairos::{Config, Engine, CancelOutcome, ManualClock};
//! use std::{sync::Arc, time::Duration};
//!
//! let clock = ManualClock::new(1_700_000_000_000);
//! let engine = Engine::in_memory(Config::default(), Arc::new(clock.clone())).unwrap();
//! engine.schedule_after(b"order:1:timeout", Duration::from_secs(1800), b"cancel order 1").unwrap();
//! engine.schedule_after(b"order:2:timeout", Duration::from_secs(1800), b"cancel order 2").unwrap();
//! assert_eq!(engine.cancel(b"order:1:timeout").unwrap(), CancelOutcome::Cancelled { deliveries: 0 }); // paid
//!
//! clock.advance(Duration::from_secs(1800));
//! engine.run_until_idle();
//! let consumer = engine.consumer();
//! let task = consumer.try_recv().unwrap();
//! assert_eq!(task.key(), b"order:2:timeout");
//! consumer.ack(&task).unwrap();
//! engine.shutdown().unwrap();
//! ```
//!
//! ## Cancel and delivery
//!
//! [`Engine::cancel`] answers exactly, with a [`CancelOutcome`]:
//! - `Cancelled { deliveries }`: the task was waiting (or due but not yet
//!   received); no consumer receives it from now on — no retry, no
//!   redelivery after a restart. With `deliveries: 0` no consumer ever
//!   received it: for such a task, "cancel answered `Cancelled`" and "a
//!   consumer received it" exclude each other, and one of them happens
//!   unless it is still waiting.
//! - `AlreadyDelivered { attempt }`: a consumer holds it now (it may still
//!   ack it); nothing more of it will be delivered. Compensate for the work
//!   in progress.
//! - `NotFound`: no live task has the key.
//!
//! This holds across crashes: under [`Durability::Sync`] a cancel's record
//! is on stable storage before `Cancelled` is returned, and a delivery's
//! before a consumer receives the task, so a power loss cannot turn one
//! answer into the other. Under `Interval` and `Buffered` it holds across
//! process crashes; a power loss may drop a recent cancel together with
//! everything logged after it (the task then fires) unless
//! [`Engine::sync`] ran after it.
//!
//! ## What a returned call survives
//!
//! Set per engine with [`Config::durability`]; a call "returned" when it
//! answered `Ok` (schedule, cancel, reschedule, ack, nack and their batch
//! forms, [`Consumer::ack_and_schedule`]):
//!
//! | mode | the call returns after its record is | process crash | power loss, OS crash |
//! |---|---|---|---|
//! | [`Durability::Sync`] (default) | fdatasynced (and proven: [`Config::proof_before_ack`]) | survives | survives |
//! | [`Durability::Interval`]`(d)` | written to the OS; an fdatasync runs every `d` of real time | survives | survives if it returned more than `d` (plus one sync) before |
//! | [`Durability::Buffered`] | written to the OS | survives | survives only if synced since: a segment roll, a background write-back (every 4 MiB), a checkpoint, [`Engine::sync`], [`Engine::shutdown`] |
//! | [`Engine::in_memory`] | applied in memory | lost | lost |
//!
//! What a power loss takes under `Interval` and `Buffered` is a suffix: if
//! a call is lost, so is every call that returned after it.
//! [`Engine::sync`] makes every call that returned before it survive a
//! power loss, in every mode. Dropping an [`Engine`] without
//! [`Engine::shutdown`] is a process crash as far as its directory is
//! concerned.
//!
//! ## Threads and blocking
//!
//! Every method blocks its calling thread until it is done, except the
//! futures: [`Consumer::recv_async`], which waits for a task without a
//! thread (its poll still takes the engine's lock, and at most once waits
//! for its ack record, as [`Consumer::try_recv`] does), and the async forms
//! of the durable calls — [`Engine::schedule_async`],
//! [`Engine::schedule_many_async`], [`Engine::reschedule_async`],
//! [`Engine::cancel_async`],
//! [`Engine::cancel_many_async`], [`Consumer::ack_async`],
//! [`Consumer::ack_many_async`], [`Consumer::nack_async`],
//! [`Consumer::ack_and_schedule_async`] (and their twins on [`Engine`]),
//! [`Engine::requeue_dead_letter_async`], [`Engine::purge_dead_letter_async`],
//! [`Engine::sync_async`] —
//! which do their work on the first poll (the engine's lock taken, as by
//! the blocking call) and then wait for the log's durability without a
//! thread (the log's writer thread commits and wakes them). None needs a
//! particular runtime. From async code, call the other methods that wait
//! for the disk (`checkpoint`, `lookup`, `shutdown`, ...) on a blocking
//! thread (e.g. tokio's
//! `spawn_blocking`).
//! Under `Sync` a schedule, cancel, reschedule, ack, nack or
//! `ack_and_schedule` waits for an fdatasync — for two, as a lone caller, with
//! [`Config::proof_before_ack`]; concurrent callers share them (group
//! commit) — and under `Interval` and `Buffered` for its record's write to
//! the OS. Besides: a schedule may wait for far tasks to be moved to disk
//! when producers outrun the move ([`Config::relocate_far_bytes`]); a
//! cancel, reschedule or lookup of a key that may be a far task's reads its
//! overflow entry from disk; [`Engine::lookup`] and [`Engine::dead_letters`]
//! may wait for a group commit under way; [`Consumer::recv`] waits for a
//! task. [`Engine::open`] starts background threads named `kairos-*` (the
//! driver and its hand-out thread, the log's writer, the checkpointer and
//! the payload prefetcher, as the configuration needs them);
//! [`Engine::shutdown`] and dropping the engine join them.
//!
//! ## Logging
//!
//! Kairos emits events through the `tracing` crate and installs no
//! subscriber: the embedder's is used, or the events are dropped. What the
//! calls cannot return goes only there: a background checkpoint or move of
//! far tasks that failed (`warn`; the engine goes on, a later one retries,
//! and the log keeps growing meanwhile), an overflow file the prefetcher or
//! a checkpoint passed over as damaged or unreadable (`warn`), the engine
//! or its log poisoned (`error`; calls then answer `Poisoned`), files
//! removed at open (`info`).
//!
//! See `README.md` for the full durability contract of each [`Durability`]
//! mode and `ARCHITECTURE.md` for a map of the code.

// Two audited exceptions, each block with its SAFETY comment, and tests (the
// index's also pass under Miri, run by hand: `cargo +nightly miri test --lib
// index::tests::zeroed`): the
// cache prefetch hint (`prefetch::prefetch_address`), used by recovery, moves
// out of memory, and the index lookups of schedule and cancel; and the
// index's bucket table (`index::Table`: a zeroed, cache-line-aligned
// allocation, so a doubling of the index writes nothing up front).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod arena;
pub mod checkpoint;
pub mod clock;
pub mod config;
mod consumer;
mod engine;
pub mod error;
pub mod far;
#[doc(hidden)]
pub mod fuzzing;
mod index;
pub mod overflow;
mod prefetch;
pub mod record;
pub mod replay;
mod task;
pub mod wheel;

pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{Config, DeliveryGuarantee, RetryPolicy};
pub use consumer::{Consumer, Delivery, Recv};
pub use engine::{
    AckScheduleOutcome, CancelOutcome, CheckpointReport, DeadLetter, Due, Engine, NackOutcome,
    NewTask, Recovery, RescheduleOutcome, Stats, TaskInfo,
};
pub use error::{
    AckError, AckScheduleError, CancelError, CheckpointError, LookupError, OpenError, RecvError,
    ScheduleError, ShutdownError, SyncError,
};
/// The write-ahead log crate, re-exported: its types appear in this crate's
/// API ([`Engine::open_with`] takes a [`kairos_wal::Storage`] such as
/// [`kairos_wal::SimStorage`]; [`OpenError::Wal`] wraps a
/// [`kairos_wal::WalError`]), so an embedder can name them with `kairos`
/// as the only dependency. Inlined, so `cargo doc -p kairos --no-deps`
/// documents it too.
#[doc(inline)]
pub use kairos_wal;
pub use kairos_wal::{Durability, RecoveryReport, TornTail};
pub use task::{TaskId, TaskState};

/// The README's examples compile (checked by `cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
