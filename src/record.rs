//! The engine's log records: what each state change of a task looks like as a
//! write-ahead-log record body. The log itself (`kairos-wal`) only sees a type
//! byte and bytes; this module owns their meaning. The byte layout is specified
//! in `wal/FORMAT.md`, section "Kairos record bodies"; the constants below
//! mirror it, each offset built from the previous one.
//!
//! Every body is checked when encoding (by the callers' validation) and again
//! when decoding: a body of the wrong length or with impossible values is a
//! [`DecodeError`], which recovery turns into a corruption error.

use crate::task::TaskId;

/// Record type of [`Record::Schedule`].
pub const RECORD_SCHEDULE: u8 = 1;
/// Record type of [`Record::Cancel`].
pub const RECORD_CANCEL: u8 = 2;
/// Record type of [`Record::Deliver`].
pub const RECORD_DELIVER: u8 = 3;
/// Record type of [`Record::Ack`].
pub const RECORD_ACK: u8 = 4;
/// Record type of [`Record::Retry`].
pub const RECORD_RETRY: u8 = 5;
/// Record type of [`Record::Dead`].
pub const RECORD_DEAD: u8 = 6;
/// Record type of [`Record::Purge`].
pub const RECORD_PURGE: u8 = 7;
/// Record type of [`Record::Reschedule`].
pub const RECORD_RESCHEDULE: u8 = 8;
/// Record type of [`Record::Release`].
pub const RECORD_RELEASE: u8 = 9;

const TASK_ID_OFFSET: usize = 0;
const TASK_ID_BYTES: usize = 8;
const DUE_MS_OFFSET: usize = TASK_ID_OFFSET + TASK_ID_BYTES;
const DUE_MS_BYTES: usize = 8;
const KEY_LEN_OFFSET: usize = DUE_MS_OFFSET + DUE_MS_BYTES;
const KEY_LEN_BYTES: usize = 2;
const PAYLOAD_LEN_OFFSET: usize = KEY_LEN_OFFSET + KEY_LEN_BYTES;
const PAYLOAD_LEN_BYTES: usize = 4;
/// Fixed part of a schedule body; key and payload follow.
pub const SCHEDULE_FIXED_BYTES: usize = PAYLOAD_LEN_OFFSET + PAYLOAD_LEN_BYTES;

/// Body size of cancel and ack records: the task id.
pub const ID_ONLY_BYTES: usize = TASK_ID_BYTES;

const FIRED_MS_OFFSET: usize = TASK_ID_OFFSET + TASK_ID_BYTES;
const FIRED_MS_BYTES: usize = 8;
/// Body size of a deliver record: task id and the wall time it was handed out.
pub const DELIVER_BYTES: usize = FIRED_MS_OFFSET + FIRED_MS_BYTES;

const ERROR_LEN_OFFSET: usize = DUE_MS_OFFSET + DUE_MS_BYTES;
const ERROR_LEN_BYTES: usize = 2;
/// Fixed part of retry and dead bodies (task id, a time, error length); the
/// error text follows.
pub const WITH_ERROR_FIXED_BYTES: usize = ERROR_LEN_OFFSET + ERROR_LEN_BYTES;
/// Longest error text a retry or dead record carries (longer texts are cut
/// at a character boundary before logging).
pub const ERROR_BYTES_MAX: usize = 4096;

const PAYLOAD_FLAG_OFFSET: usize = DUE_MS_OFFSET + DUE_MS_BYTES;
const PAYLOAD_FLAG_BYTES: usize = 1;
const NEW_PAYLOAD_LEN_OFFSET: usize = PAYLOAD_FLAG_OFFSET + PAYLOAD_FLAG_BYTES;
/// Fixed part of a reschedule body; the new payload (if any) follows.
pub const RESCHEDULE_FIXED_BYTES: usize = NEW_PAYLOAD_LEN_OFFSET + PAYLOAD_LEN_BYTES;

/// A decoded record body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record<'a> {
    /// A task was scheduled: its id, absolute due time (UTC ms), key, payload.
    Schedule {
        /// Engine-assigned id, unique for the life of the directory.
        id: TaskId,
        /// Due time, milliseconds since the Unix epoch (UTC).
        due_ms: u64,
        /// Caller-chosen key.
        key: &'a [u8],
        /// Payload bytes.
        payload: &'a [u8],
    },
    /// A scheduled task was cancelled before delivery.
    Cancel {
        /// The cancelled task.
        id: TaskId,
    },
    /// A task was handed to the consumers at wall time `fired_ms`.
    Deliver {
        /// The delivered task.
        id: TaskId,
        /// Wall time of the hand-out, ms since the Unix epoch.
        fired_ms: u64,
    },
    /// A consumer acknowledged a delivery: the task is finished.
    Ack {
        /// The finished task.
        id: TaskId,
    },
    /// A delivered task failed (nack, or its lease expired) and waits for
    /// its next attempt at `due_ms`.
    Retry {
        /// The task.
        id: TaskId,
        /// When the next attempt is due, UTC ms.
        due_ms: u64,
        /// Why the attempt failed (UTF-8, at most [`ERROR_BYTES_MAX`] bytes).
        error: &'a [u8],
    },
    /// A delivered task exhausted its attempts and became a dead letter.
    Dead {
        /// The task.
        id: TaskId,
        /// When it was dead-lettered, UTC ms.
        dead_ms: u64,
        /// Why the last attempt failed (UTF-8, at most [`ERROR_BYTES_MAX`] bytes).
        error: &'a [u8],
    },
    /// A dead letter was removed (purged, or requeued as a new task).
    Purge {
        /// The dead letter's task id.
        id: TaskId,
    },
    /// A waiting task got a new due time and, if `payload` is `Some`, a new
    /// payload.
    Reschedule {
        /// The task.
        id: TaskId,
        /// The new due time, UTC ms.
        due_ms: u64,
        /// The new payload, or `None` to keep the old one.
        payload: Option<&'a [u8]>,
    },
    /// A delivery that no consumer received was taken back (at a clean
    /// shutdown): it does not count as an attempt.
    Release {
        /// The task.
        id: TaskId,
    },
}

/// A record body that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad {kind} record: {reason}")]
pub struct DecodeError {
    /// Which record type was being decoded.
    pub kind: &'static str,
    /// What was wrong.
    pub reason: String,
}

impl Record<'_> {
    /// The record's type byte.
    pub fn record_type(&self) -> u8 {
        match self {
            Record::Schedule { .. } => RECORD_SCHEDULE,
            Record::Cancel { .. } => RECORD_CANCEL,
            Record::Deliver { .. } => RECORD_DELIVER,
            Record::Ack { .. } => RECORD_ACK,
            Record::Retry { .. } => RECORD_RETRY,
            Record::Dead { .. } => RECORD_DEAD,
            Record::Purge { .. } => RECORD_PURGE,
            Record::Reschedule { .. } => RECORD_RESCHEDULE,
            Record::Release { .. } => RECORD_RELEASE,
        }
    }

    /// Appends the body's bytes to `out`. Crate-internal: the engine has
    /// already checked a schedule's key (≤ `u16::MAX` bytes) and payload
    /// (≤ `u32::MAX` bytes) against far smaller configured limits, so the
    /// length conversions below cannot fail.
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        match *self {
            Record::Schedule {
                id,
                due_ms,
                key,
                payload,
            } => {
                let key_len = u16::try_from(key.len()).expect("key length validated");
                let payload_len = u32::try_from(payload.len()).expect("payload length validated");
                out.reserve(SCHEDULE_FIXED_BYTES + key.len() + payload.len());
                out.extend_from_slice(&id.0.to_le_bytes());
                out.extend_from_slice(&due_ms.to_le_bytes());
                out.extend_from_slice(&key_len.to_le_bytes());
                out.extend_from_slice(&payload_len.to_le_bytes());
                out.extend_from_slice(key);
                out.extend_from_slice(payload);
            }
            Record::Cancel { id }
            | Record::Ack { id }
            | Record::Purge { id }
            | Record::Release { id } => out.extend_from_slice(&id.0.to_le_bytes()),
            Record::Retry {
                id,
                due_ms: time_ms,
                error,
            }
            | Record::Dead {
                id,
                dead_ms: time_ms,
                error,
            } => {
                let error = &error[..error.len().min(ERROR_BYTES_MAX)];
                let error_len = u16::try_from(error.len()).expect("ERROR_BYTES_MAX < 2^16");
                out.reserve(WITH_ERROR_FIXED_BYTES + error.len());
                out.extend_from_slice(&id.0.to_le_bytes());
                out.extend_from_slice(&time_ms.to_le_bytes());
                out.extend_from_slice(&error_len.to_le_bytes());
                out.extend_from_slice(error);
            }
            Record::Reschedule {
                id,
                due_ms,
                payload,
            } => {
                let bytes = payload.unwrap_or(&[]);
                let payload_len = u32::try_from(bytes.len()).expect("payload length validated");
                out.reserve(RESCHEDULE_FIXED_BYTES + bytes.len());
                out.extend_from_slice(&id.0.to_le_bytes());
                out.extend_from_slice(&due_ms.to_le_bytes());
                out.push(u8::from(payload.is_some()));
                out.extend_from_slice(&payload_len.to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Record::Deliver { id, fired_ms } => {
                out.extend_from_slice(&id.0.to_le_bytes());
                out.extend_from_slice(&fired_ms.to_le_bytes());
            }
        }
    }

    /// Decodes a body of type `record_type`.
    pub fn decode(record_type: u8, body: &[u8]) -> Result<Record<'_>, DecodeError> {
        match record_type {
            RECORD_SCHEDULE => decode_schedule(body),
            RECORD_CANCEL => Ok(Record::Cancel {
                id: decode_id_only("cancel", body)?,
            }),
            RECORD_ACK => Ok(Record::Ack {
                id: decode_id_only("ack", body)?,
            }),
            RECORD_PURGE => Ok(Record::Purge {
                id: decode_id_only("purge", body)?,
            }),
            RECORD_RELEASE => Ok(Record::Release {
                id: decode_id_only("release", body)?,
            }),
            RECORD_RETRY => {
                let (id, due_ms, error) = decode_with_error("retry", body)?;
                Ok(Record::Retry { id, due_ms, error })
            }
            RECORD_DEAD => {
                let (id, dead_ms, error) = decode_with_error("dead", body)?;
                Ok(Record::Dead { id, dead_ms, error })
            }
            RECORD_RESCHEDULE => decode_reschedule(body),
            RECORD_DELIVER => {
                exact_len("deliver", body, DELIVER_BYTES)?;
                Ok(Record::Deliver {
                    id: TaskId(read_u64(body, TASK_ID_OFFSET)),
                    fired_ms: read_u64(body, FIRED_MS_OFFSET),
                })
            }
            other => Err(DecodeError {
                kind: "unknown",
                reason: format!("record type {other} is not a Kairos record"),
            }),
        }
    }
}

fn decode_schedule(body: &[u8]) -> Result<Record<'_>, DecodeError> {
    let err = |reason: String| DecodeError {
        kind: "schedule",
        reason,
    };
    if body.len() < SCHEDULE_FIXED_BYTES {
        return Err(err(format!(
            "body is {} bytes, shorter than the fixed {SCHEDULE_FIXED_BYTES}",
            body.len()
        )));
    }
    let key_len = usize::from(u16::from_le_bytes([
        body[KEY_LEN_OFFSET],
        body[KEY_LEN_OFFSET + 1],
    ]));
    let payload_len = u32::from_le_bytes([
        body[PAYLOAD_LEN_OFFSET],
        body[PAYLOAD_LEN_OFFSET + 1],
        body[PAYLOAD_LEN_OFFSET + 2],
        body[PAYLOAD_LEN_OFFSET + 3],
    ]) as usize;
    let expected = SCHEDULE_FIXED_BYTES
        .checked_add(key_len)
        .and_then(|n| n.checked_add(payload_len));
    if expected != Some(body.len()) {
        return Err(err(format!(
            "key {key_len} + payload {payload_len} bytes do not match a {} byte body",
            body.len()
        )));
    }
    if key_len == 0 {
        return Err(err("empty key".into()));
    }
    let id = read_u64(body, TASK_ID_OFFSET);
    if id == u64::MAX {
        // Ids strictly increase and the engine continues after the largest one: no id can
        // follow this one, so the engine never writes it.
        return Err(err("task id u64::MAX (no id can follow it)".into()));
    }
    let key_end = SCHEDULE_FIXED_BYTES + key_len;
    Ok(Record::Schedule {
        id: TaskId(id),
        due_ms: read_u64(body, DUE_MS_OFFSET),
        key: &body[SCHEDULE_FIXED_BYTES..key_end],
        payload: &body[key_end..],
    })
}

fn decode_with_error<'a>(
    kind: &'static str,
    body: &'a [u8],
) -> Result<(TaskId, u64, &'a [u8]), DecodeError> {
    let err = |reason: String| DecodeError { kind, reason };
    if body.len() < WITH_ERROR_FIXED_BYTES {
        return Err(err(format!(
            "body is {} bytes, shorter than the fixed {WITH_ERROR_FIXED_BYTES}",
            body.len()
        )));
    }
    let error_len = usize::from(u16::from_le_bytes([
        body[ERROR_LEN_OFFSET],
        body[ERROR_LEN_OFFSET + 1],
    ]));
    if error_len > ERROR_BYTES_MAX || WITH_ERROR_FIXED_BYTES + error_len != body.len() {
        return Err(err(format!(
            "error length {error_len} does not match a {} byte body (max {ERROR_BYTES_MAX})",
            body.len()
        )));
    }
    Ok((
        TaskId(read_u64(body, TASK_ID_OFFSET)),
        read_u64(body, DUE_MS_OFFSET),
        &body[WITH_ERROR_FIXED_BYTES..],
    ))
}

fn decode_reschedule(body: &[u8]) -> Result<Record<'_>, DecodeError> {
    let err = |reason: String| DecodeError {
        kind: "reschedule",
        reason,
    };
    if body.len() < RESCHEDULE_FIXED_BYTES {
        return Err(err(format!(
            "body is {} bytes, shorter than the fixed {RESCHEDULE_FIXED_BYTES}",
            body.len()
        )));
    }
    let flag = body[PAYLOAD_FLAG_OFFSET];
    let payload_len = u32::from_le_bytes([
        body[NEW_PAYLOAD_LEN_OFFSET],
        body[NEW_PAYLOAD_LEN_OFFSET + 1],
        body[NEW_PAYLOAD_LEN_OFFSET + 2],
        body[NEW_PAYLOAD_LEN_OFFSET + 3],
    ]) as usize;
    if RESCHEDULE_FIXED_BYTES.checked_add(payload_len) != Some(body.len()) {
        return Err(err(format!(
            "payload {payload_len} bytes does not match a {} byte body",
            body.len()
        )));
    }
    let payload = match flag {
        0 if payload_len == 0 => None,
        1 => Some(&body[RESCHEDULE_FIXED_BYTES..]),
        _ => {
            return Err(err(format!(
                "payload flag {flag} with {payload_len} payload bytes"
            )))
        }
    };
    Ok(Record::Reschedule {
        id: TaskId(read_u64(body, TASK_ID_OFFSET)),
        due_ms: read_u64(body, DUE_MS_OFFSET),
        payload,
    })
}

fn decode_id_only(kind: &'static str, body: &[u8]) -> Result<TaskId, DecodeError> {
    exact_len(kind, body, ID_ONLY_BYTES)?;
    Ok(TaskId(read_u64(body, TASK_ID_OFFSET)))
}

fn exact_len(kind: &'static str, body: &[u8], len: usize) -> Result<(), DecodeError> {
    if body.len() == len {
        Ok(())
    } else {
        Err(DecodeError {
            kind,
            reason: format!("body is {} bytes, expected {len}", body.len()),
        })
    }
}

fn read_u64(body: &[u8], offset: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&body[offset..offset + 8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(r: Record<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        r.encode_into(&mut out);
        assert_eq!(Record::decode(r.record_type(), &out), Ok(r));
        out
    }

    #[test]
    fn golden_schedule_body() {
        let bytes = round_trip(Record::Schedule {
            id: TaskId(0x0102),
            due_ms: 0x0A0B,
            key: b"k1",
            payload: b"xyz",
        });
        let expected: Vec<u8> = [
            &[0x02, 0x01, 0, 0, 0, 0, 0, 0][..],
            &[0x0B, 0x0A, 0, 0, 0, 0, 0, 0],
            &[2, 0],
            &[3, 0, 0, 0],
            b"k1",
            b"xyz",
        ]
        .concat();
        assert_eq!(bytes, expected);
    }

    #[test]
    fn golden_small_bodies() {
        assert_eq!(
            round_trip(Record::Cancel { id: TaskId(7) }),
            vec![7, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            round_trip(Record::Ack { id: TaskId(9) }),
            vec![9, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            round_trip(Record::Deliver {
                id: TaskId(1),
                fired_ms: 2
            }),
            vec![1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn golden_delivery_outcome_bodies() {
        assert_eq!(
            round_trip(Record::Retry {
                id: TaskId(3),
                due_ms: 0x0102,
                error: b"no"
            }),
            vec![3, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 2, 0, b'n', b'o']
        );
        assert_eq!(
            round_trip(Record::Dead {
                id: TaskId(3),
                dead_ms: 5,
                error: b""
            }),
            vec![3, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            round_trip(Record::Purge { id: TaskId(4) }),
            vec![4, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            round_trip(Record::Release { id: TaskId(5) }),
            vec![5, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            round_trip(Record::Reschedule {
                id: TaskId(6),
                due_ms: 7,
                payload: None
            }),
            vec![6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            round_trip(Record::Reschedule {
                id: TaskId(6),
                due_ms: 7,
                payload: Some(b"p")
            }),
            vec![6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, b'p']
        );
    }

    #[test]
    fn long_error_texts_are_cut_to_the_maximum() {
        let long = vec![b'e'; ERROR_BYTES_MAX + 10];
        let mut out = Vec::new();
        Record::Dead {
            id: TaskId(1),
            dead_ms: 0,
            error: &long,
        }
        .encode_into(&mut out);
        assert_eq!(out.len(), WITH_ERROR_FIXED_BYTES + ERROR_BYTES_MAX);
        assert!(Record::decode(RECORD_DEAD, &out).is_ok());
    }

    #[test]
    fn bad_delivery_outcome_bodies_are_errors() {
        // Error length past the body.
        let mut body = vec![0u8; WITH_ERROR_FIXED_BYTES];
        body[ERROR_LEN_OFFSET] = 1;
        assert!(Record::decode(RECORD_RETRY, &body).is_err());
        // Error length above the maximum, even if the body holds it.
        let mut body = vec![0u8; WITH_ERROR_FIXED_BYTES + ERROR_BYTES_MAX + 1];
        body[ERROR_LEN_OFFSET..ERROR_LEN_OFFSET + 2]
            .copy_from_slice(&((ERROR_BYTES_MAX + 1) as u16).to_le_bytes());
        assert!(Record::decode(RECORD_DEAD, &body).is_err());
        // "Keep the payload" with payload bytes, and an unknown flag.
        let mut body = vec![0u8; RESCHEDULE_FIXED_BYTES + 1];
        body[NEW_PAYLOAD_LEN_OFFSET] = 1;
        assert!(Record::decode(RECORD_RESCHEDULE, &body).is_err());
        let mut body = vec![0u8; RESCHEDULE_FIXED_BYTES];
        body[PAYLOAD_FLAG_OFFSET] = 2;
        assert!(Record::decode(RECORD_RESCHEDULE, &body).is_err());
        assert!(Record::decode(RECORD_PURGE, &[0; 7]).is_err());
        assert!(Record::decode(RECORD_RELEASE, &[0; 9]).is_err());
    }

    #[test]
    fn bad_bodies_are_errors() {
        assert!(Record::decode(RECORD_CANCEL, &[1, 2, 3]).is_err());
        assert!(Record::decode(RECORD_DELIVER, &[0; 9]).is_err());
        assert!(Record::decode(99, &[]).is_err());
        // Schedule whose lengths claim more than the body holds.
        let mut body = vec![0u8; SCHEDULE_FIXED_BYTES];
        body[KEY_LEN_OFFSET] = 0xFF;
        body[PAYLOAD_LEN_OFFSET..PAYLOAD_LEN_OFFSET + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Record::decode(RECORD_SCHEDULE, &body).is_err());
        // Empty key.
        let body = vec![0u8; SCHEDULE_FIXED_BYTES];
        assert!(Record::decode(RECORD_SCHEDULE, &body).is_err());
    }
}
