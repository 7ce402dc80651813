//! Typed errors, one enum per operation whose callers react differently.

use kairos_wal::WalError;
use std::path::PathBuf;

/// Characters of a key an error message shows; a longer key is cut there
/// (the error's `key` field holds it whole).
const KEY_SHOWN_CHARS_MAX: usize = 100;

/// `key` quoted (`{:?}`) for an error message: whole up to
/// [`KEY_SHOWN_CHARS_MAX`] characters, else its first ones, "…" and its
/// length — a key may be 64 KiB, and a message of that size helps no one.
fn key_shown(key: &str) -> String {
    match key.char_indices().nth(KEY_SHOWN_CHARS_MAX) {
        None => format!("{key:?}"),
        Some((cut, _)) => format!("{:?}… ({} characters)", &key[..cut], key.chars().count()),
    }
}

/// What every `Poisoned` error's message ends with: what a caller does about it.
pub(crate) const POISON_REMEDY: &str = "a poisoned engine takes no more changes: shut it down, \
     deal with the cause, and open the directory again";

/// Opening an engine failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Another engine (in this or another process) holds the directory.
    #[error("data directory {path} is already open (lock held on {path}/LOCK)")]
    Locked {
        /// The data directory.
        path: PathBuf,
    },
    /// A configuration field is out of range.
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// Which field and why.
        reason: String,
    },
    /// An operation on the data directory failed: creating or locking it
    /// (an empty path is refused here too), listing or tidying its
    /// checkpoint and overflow directories, reading the log's META beside
    /// a checkpoint. `op` names the operation, `path` the file or directory.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The write-ahead log could not be opened or recovered (corruption,
    /// foreign or missing segment, I/O error). Corruption names file and offset.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// The newest checkpoint file is damaged (file and offset), of an unknown
    /// version, or unreadable, and no older one could be used.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointReadError),
    /// An overflow file a live task's payload is in is damaged (file and
    /// offset) or unreadable.
    #[error(transparent)]
    Overflow(#[from] crate::overflow::OverflowReadError),
    /// A far task that a log record after the checkpoint needed whole
    /// (delivered, rescheduled or nacked since: its key and due time are
    /// only in its overflow entry) is live, or a dead letter, at the end of
    /// the log, and that entry does not read back — damaged, or its file
    /// missing. The directory cannot be served as it is: `kairos salvage`
    /// lists such tasks, and `--discard` cancels them (purges a dead
    /// letter), losing their keys and payloads. (A far task a later record
    /// finished — acked, cancelled, purged — needs its entry no more, and
    /// does not stop the open.)
    #[error(
        "far task {task_id} is {} at the end of the log, and its overflow entry (byte offset \
         {offset} of {path}), which a record after the checkpoint needed for its key, does not \
         read back: {reason} (`kairos salvage` lists it; `--discard` {} it)",
        if *.dead_letter { "a dead letter" } else { "live" },
        if *.dead_letter { "purges" } else { "cancels" }
    )]
    FarEntryUnreadable {
        /// The task's id.
        task_id: u64,
        /// Whether it is a dead letter (else a live task).
        dead_letter: bool,
        /// The overflow file.
        path: PathBuf,
        /// The entry's byte offset in it.
        offset: u64,
        /// Why the entry does not read back.
        reason: String,
    },
    /// A checkpoint file reads back but does not fit the log beside it
    /// (another directory's, or log records after it are missing).
    #[error("checkpoint {path} does not fit the log: {reason}")]
    CheckpointMismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
}

/// A checkpoint could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// An in-memory engine has no directory to write one to.
    #[error("an in-memory engine has no checkpoints")]
    InMemory,
    /// The engine was shut down.
    #[error("engine is shut down")]
    Closed,
    /// The engine is poisoned by a failed write or sync (of this checkpoint or earlier), or
    /// by an earlier failed read of a far task's overflow entry, or by a panic in one of its
    /// threads (a bug).
    #[error("engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The first failure.
        cause: String,
    },
    /// A file operation failed. The engine goes on, and a later checkpoint
    /// retries. Either writing the checkpoint file (or an overflow file)
    /// failed, and the previous checkpoint and the log are intact; or the
    /// checkpoint was written and the log trimmed, and removing an older
    /// checkpoint file or an overflow file it made unneeded failed. Either
    /// way, the directory opens as a whole (old or new checkpoint).
    #[error("checkpoint: {op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path it was applied to.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Syncing the log failed: the engine is poisoned (as by any failed
    /// sync).
    #[error(transparent)]
    Wal(#[from] WalError),
    /// The checkpoint is written, but deleting the log segments it covers
    /// failed (writing `TRIM`, removing a segment, fsyncing the log
    /// directory). The engine goes on; a later checkpoint retries.
    #[error("checkpoint written, but deleting the log segments it covers failed: {0}")]
    Trim(WalError),
    /// An overflow file being compacted did not read back (unreadable or
    /// damaged, naming file and offset). The engine goes on; the previous
    /// checkpoint and the log are intact. A file chosen for compaction that
    /// cannot be read at all (I/O error) is left as it is instead: the
    /// checkpoint is written, the log trimmed, and then this error reported.
    #[error(transparent)]
    Overflow(#[from] crate::overflow::OverflowReadError),
}

/// Scheduling failed; nothing was scheduled (a batch is all or nothing) —
/// except for `Poisoned`, whose outcome is unknown to the caller: when the
/// failure was this call's own write or sync, its record may or may not
/// have reached the disk, and the task (or the requeue) may be there after
/// a reopen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// The key is empty.
    #[error("empty key")]
    EmptyKey,
    /// The key is longer than the configured maximum.
    #[error("key is {bytes} bytes, the maximum is {max}")]
    KeyTooLong {
        /// Its length.
        bytes: usize,
        /// `Config::key_bytes_max`.
        max: usize,
    },
    /// The payload is larger than the configured maximum.
    #[error("payload is {bytes} bytes, the maximum is {max}")]
    PayloadTooLarge {
        /// Its length.
        bytes: usize,
        /// `Config::payload_bytes_max`.
        max: usize,
    },
    /// The due time is further ahead than `Config::delay_max` (never clamped).
    #[error("due time {due_ms} ms is past the latest accepted {max_ms} ms (now + delay_max)")]
    DueTooFar {
        /// Requested due time, UTC ms (saturated at `u64::MAX`).
        due_ms: u64,
        /// Latest acceptable due time at the moment of the call, UTC ms:
        /// now + `delay_max`, rounded up as due times are (a due time is
        /// accepted exactly when its ms are at most this).
        max_ms: u64,
    },
    /// The due time is before the Unix epoch.
    #[error("due time is before the Unix epoch")]
    DueBeforeEpoch,
    /// A task with this key is already live (scheduled, or delivered and not acked).
    /// Answered before `TooManyPending`: at the pending limit a schedule of a
    /// live key still says that the key is live.
    #[error("a task with key {} is already pending", key_shown(key))]
    AlreadyExists {
        /// The key, lossily as UTF-8.
        key: String,
    },
    /// The same key appears twice in one batch.
    #[error("key {} appears twice in one batch", key_shown(key))]
    DuplicateKeyInBatch {
        /// The key, lossily as UTF-8.
        key: String,
    },
    /// The batch is larger than [`crate::config::BATCH_TASKS_MAX`].
    #[error("batch of {tasks} tasks exceeds the maximum of {max}")]
    BatchTooLarge {
        /// Tasks in the batch.
        tasks: usize,
        /// The maximum.
        max: usize,
    },
    /// The batch's log records would exceed one log frame
    /// (`kairos_wal::format::FRAME_BODY_BYTES_MAX`, 1 GiB); split it.
    #[error("batch of {bytes} bytes exceeds the largest log frame of {max} bytes")]
    BatchTooManyBytes {
        /// Encoded size of the batch.
        bytes: usize,
        /// The maximum.
        max: usize,
    },
    /// Live tasks would exceed `Config::pending_tasks_max` (and no key of
    /// the call is live: that is `AlreadyExists`).
    #[error("{pending} tasks are pending; the maximum is {max}")]
    TooManyPending {
        /// Live tasks now.
        pending: usize,
        /// `Config::pending_tasks_max`.
        max: usize,
    },
    /// A consumer holds the task with this key now: it cannot be
    /// rescheduled (cancel it, or let the consumer nack it).
    #[error("task {} is held by a consumer", key_shown(key))]
    InFlight {
        /// The key (lossy UTF-8).
        key: String,
    },
    /// No dead letter has this task id.
    #[error("no dead letter with task id {task_id}")]
    NotDeadLetter {
        /// The id asked for.
        task_id: u64,
    },
    /// The engine was shut down.
    #[error("the engine is shut down")]
    Closed,
    /// A write or sync failed — this call's own, or an earlier one — or a
    /// far task's overflow entry could not be read (by this call or an
    /// earlier one; this poisons the engine too), or one of the engine's
    /// threads panicked (a bug); the engine refuses work until reopened. The outcome of this call is unknown (see the type's
    /// docs).
    #[error("the engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

/// Cancelling failed. The outcome is unknown to the caller only for
/// `Poisoned`: the cancel record may or may not have reached the disk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// More keys than [`crate::config::BATCH_TASKS_MAX`] in one call; nothing was cancelled.
    #[error("batch of {tasks} keys exceeds the maximum of {max}")]
    BatchTooLarge {
        /// Keys in the call.
        tasks: usize,
        /// The maximum.
        max: usize,
    },
    /// The engine was shut down.
    #[error("the engine is shut down")]
    Closed,
    /// A write or sync failed, or a far task's overflow entry could not be
    /// read (which poisons the engine), or one of the engine's threads
    /// panicked (a bug); the engine refuses work until reopened.
    #[error("the engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

/// Looking a task up ([`crate::Engine::lookup`]) failed; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The engine was shut down.
    #[error("the engine is shut down")]
    Closed,
    /// A write or sync failed, or a far task's overflow entry could not be
    /// read (which poisons the engine), or one of the engine's threads
    /// panicked (a bug); the engine refuses work until reopened.
    #[error("the engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

/// [`crate::Consumer::ack_and_schedule`] failed. Nothing changed — the
/// delivery is still outstanding (or refused as by [`AckError`]) and no task
/// was scheduled — except for `Ack(AckError::Poisoned)`, whose outcome is
/// unknown to the caller: the frame holding both the ack and the new task's
/// schedule may or may not have reached the disk (after a reopen either
/// both hold or neither does).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AckScheduleError {
    /// The delivery cannot be acknowledged, as [`crate::Consumer::ack`]
    /// answers: [`AckError::LeaseExpired`], [`AckError::NotOutstanding`];
    /// also [`AckError::Closed`] and [`AckError::Poisoned`] (never under
    /// `Schedule`, whichever part met them).
    #[error(transparent)]
    Ack(AckError),
    /// The next task is refused, as [`crate::Engine::schedule`] refuses it:
    /// [`ScheduleError::PayloadTooLarge`], [`ScheduleError::DueTooFar`],
    /// [`ScheduleError::DueBeforeEpoch`], and [`ScheduleError::KeyTooLong`]
    /// when the delivery's key is longer than the configuration in use
    /// allows (the directory reopened with a lower
    /// [`crate::Config::key_bytes_max`]: such a recurring series ends here);
    /// for a delivery taken at most once (a plain schedule of its key) also
    /// [`ScheduleError::AlreadyExists`] and [`ScheduleError::TooManyPending`].
    #[error(transparent)]
    Schedule(ScheduleError),
}

impl From<AckError> for AckScheduleError {
    fn from(e: AckError) -> Self {
        AckScheduleError::Ack(e)
    }
}

impl From<ScheduleError> for AckScheduleError {
    /// `Closed` and `Poisoned` become [`AckScheduleError::Ack`]'s, so that a
    /// caller matches them in one place.
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Closed => AckScheduleError::Ack(AckError::Closed),
            ScheduleError::Poisoned { cause } => {
                AckScheduleError::Ack(AckError::Poisoned { cause })
            }
            other => AckScheduleError::Schedule(other),
        }
    }
}

/// Acknowledging a delivery (or nacking it, or extending its lease) failed.
/// Nothing changed — except for `Poisoned`, whose outcome is unknown to the
/// caller: an ack or nack record whose own write or sync failed may or may
/// not have reached the disk (after a reopen the task is then finished, or
/// retried or dead-lettered as the nack said).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AckError {
    /// More deliveries than [`crate::config::BATCH_TASKS_MAX`] in one call; nothing was acked.
    #[error("batch of {tasks} deliveries exceeds the maximum of {max}")]
    BatchTooLarge {
        /// Deliveries in the call.
        tasks: usize,
        /// The maximum.
        max: usize,
    },
    /// The delivery is not outstanding, and its task is finished or will be
    /// at its lease's end — acked, cancelled, dead-lettered (also when its
    /// last attempt's lease just ran out) — or unknown, or the delivery is
    /// from another engine instance (e.g. from before a restart), or it is
    /// given a second time in one [`crate::Consumer::ack_many`]. Nothing
    /// changed.
    #[error(
        "delivery of task {task_id} is not outstanding (finished, stale, from another engine, or given twice to one ack_many)"
    )]
    NotOutstanding {
        /// The task id in the delivery.
        task_id: u64,
    },
    /// This delivery's attempt is over — its lease ran out, or it was nacked
    /// — and the task lives on: it waits for, or is in, a later attempt (so
    /// another consumer may run it again). Nothing changed.
    #[error("the attempt of task {task_id}'s delivery is over (lease expired or nacked); the task is retried")]
    LeaseExpired {
        /// The task id in the delivery.
        task_id: u64,
    },
    /// A nack asked for a retry later than `Config::delay_max`.
    #[error("retry after {retry_after_ms} ms is past the maximum delay of {max_ms} ms")]
    RetryTooFar {
        /// The retry delay asked for, ms, rounded up.
        retry_after_ms: u64,
        /// `Config::delay_max`, ms, rounded down.
        max_ms: u64,
    },
    /// A lease extension shorter than 1 ms or longer than `LEASE_MAX`.
    #[error("lease of {lease_ms} ms is not in 1..={max_ms} ms")]
    InvalidLease {
        /// The lease asked for, ms: rounded down when too short, up when too
        /// long.
        lease_ms: u64,
        /// `LEASE_MAX`, ms.
        max_ms: u64,
    },
    /// The engine was shut down.
    #[error("the engine is shut down")]
    Closed,
    /// A write or sync failed, or a far task's overflow entry could not be
    /// read (which poisons the engine), or one of the engine's threads
    /// panicked (a bug); the engine refuses work until reopened.
    #[error("the engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

/// Why a consumer could not receive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecvError {
    /// Nothing is ready (`try_recv` only).
    #[error("no task is ready")]
    Empty,
    /// Nothing became ready in time (`recv_timeout` only).
    #[error("timed out waiting for a task")]
    Timeout,
    /// The engine was shut down and nothing is left to receive.
    #[error("the engine is shut down")]
    Closed,
    /// The engine stopped after an I/O failure (or a panic in one of its
    /// threads: a bug); `cause` says which.
    #[error("the engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

/// [`crate::Engine::sync`] failed: what was logged before the call may not be durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    /// The engine was shut down: before the call, or while it waited and before what it
    /// waited for was durable.
    #[error("the engine is shut down")]
    Closed,
    /// A write or fdatasync failed (this one or an earlier one), or an earlier read of a far
    /// task's overflow entry did, or one of the engine's threads panicked (a bug); the engine
    /// refuses work until reopened, and what was logged before the call is not known to be
    /// durable.
    #[error("the engine is poisoned: {cause} ({})", POISON_REMEDY)]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

/// Shutting down failed to flush the log; anything not yet durable may be lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShutdownError {
    /// The log could not be flushed and closed.
    #[error(transparent)]
    Wal(#[from] WalError),
    /// The engine was poisoned before shutdown (by a failed write, sync or
    /// read, or a panic in one of its threads: a bug). It is shut down
    /// nonetheless: what to do is deal with the cause and open the
    /// directory again.
    #[error("the engine was poisoned: {cause} (it is shut down; deal with the cause and open the directory again)")]
    Poisoned {
        /// The original failure.
        cause: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key in an error message is shown whole up to 100 characters, cut
    /// after them with its length otherwise; the field keeps it whole.
    #[test]
    fn a_long_key_is_cut_in_the_message_not_in_the_field() {
        let short = "order:1".to_string();
        assert_eq!(
            ScheduleError::AlreadyExists { key: short.clone() }.to_string(),
            "a task with key \"order:1\" is already pending"
        );
        let exactly: String = "é".repeat(KEY_SHOWN_CHARS_MAX);
        assert_eq!(
            ScheduleError::InFlight {
                key: exactly.clone()
            }
            .to_string(),
            format!("task {exactly:?} is held by a consumer")
        );
        let long: String = "k".repeat(65_536);
        let e = ScheduleError::DuplicateKeyInBatch { key: long.clone() };
        assert_eq!(
            e.to_string(),
            format!(
                "key {:?}… (65536 characters) appears twice in one batch",
                "k".repeat(KEY_SHOWN_CHARS_MAX)
            )
        );
        assert!(matches!(e, ScheduleError::DuplicateKeyInBatch { key } if key == long));
    }
}
