//! Describing log records to people and to JSON, shared by `kairos dump` and
//! `kairos inspect` (and `kairos dead-letters`, for its times): record type
//! names, times as RFC 3339, and keys, payloads and error texts made safe to
//! print on one line.
//!
//! Everything here works on bytes already read and bounded by
//! `kairos_wal::scan`; nothing allocates from a length found on disk.

use kairos::record::{
    Record, RECORD_ACK, RECORD_CANCEL, RECORD_DEAD, RECORD_DELIVER, RECORD_PURGE, RECORD_RELEASE,
    RECORD_RESCHEDULE, RECORD_RETRY, RECORD_SCHEDULE,
};
use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

/// The name of a record type: `SCHEDULE`, `CANCEL`, …, or `UNKNOWN(n)` for a
/// type byte the engine does not write.
pub fn type_name(record_type: u8) -> Cow<'static, str> {
    Cow::Borrowed(match record_type {
        RECORD_SCHEDULE => "SCHEDULE",
        RECORD_CANCEL => "CANCEL",
        RECORD_DELIVER => "DELIVER",
        RECORD_ACK => "ACK",
        RECORD_RETRY => "RETRY",
        RECORD_DEAD => "DEAD",
        RECORD_PURGE => "PURGE",
        RECORD_RESCHEDULE => "RESCHEDULE",
        RECORD_RELEASE => "RELEASE",
        other => return Cow::Owned(format!("UNKNOWN({other})")),
    })
}

/// The task a record names (every record type names one).
pub fn task_id(record: &Record<'_>) -> u64 {
    match *record {
        Record::Schedule { id, .. }
        | Record::Cancel { id }
        | Record::Deliver { id, .. }
        | Record::Ack { id }
        | Record::Retry { id, .. }
        | Record::Dead { id, .. }
        | Record::Purge { id }
        | Record::Reschedule { id, .. }
        | Record::Release { id } => id.0,
    }
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z).
const RFC3339_MS_MAX: u64 = 253_402_300_799_999;

/// `ms` milliseconds after the Unix epoch as RFC 3339 in UTC with
/// milliseconds (`2030-01-02T03:04:05.678Z`); `None` past the year 9999,
/// which RFC 3339 cannot write (callers print the raw integer instead).
pub fn rfc3339(ms: u64) -> Option<String> {
    if ms > RFC3339_MS_MAX {
        return None;
    }
    let time = UNIX_EPOCH.checked_add(Duration::from_millis(ms))?;
    // `write!` rather than `to_string`: a formatter error is an answer here, not a panic.
    let mut text = String::new();
    write!(text, "{}", humantime::format_rfc3339_millis(time)).ok()?;
    Some(text)
}

/// `bytes` in double quotes for a line of text: UTF-8 as it is, with quotes,
/// backslashes, control and other unprintable characters escaped as Rust
/// escapes them (`\n`, `\u{1b}`), and bytes that are not UTF-8 as `\xNN`.
/// Nothing in the result can break the line or drive a terminal.
pub fn quoted(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push('"');
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\'' {
                out.push(c);
            } else {
                out.extend(c.escape_debug());
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('"');
    out
}

/// `bytes` as a string for JSON: UTF-8 lossily (JSON escapes the control
/// characters itself).
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `bytes` as lowercase hex digits if they are not valid UTF-8 — the exact
/// bytes beside a [`lossy`] rendering that lost some; `None` if they are.
pub fn hex_unless_utf8(bytes: &[u8]) -> Option<String> {
    use std::fmt::Write as _;
    std::str::from_utf8(bytes).is_err().then(|| {
        bytes
            .iter()
            .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
                let _ = write!(out, "{b:02x}");
                out
            })
    })
}

/// The first `limit` bytes of `bytes` (all of them with `None`), cut back to
/// a character boundary if the limit falls inside a UTF-8 sequence; and
/// whether anything was left out.
pub fn preview(bytes: &[u8], limit: Option<usize>) -> (&[u8], bool) {
    let Some(limit) = limit.filter(|&l| l < bytes.len()) else {
        return (bytes, false);
    };
    let mut end = limit;
    // At most three continuation bytes follow a UTF-8 lead byte.
    for _ in 0..3 {
        if end > 0 && bytes[end] & 0xC0 == 0x80 {
            end -= 1;
        } else {
            break;
        }
    }
    if bytes[end] & 0xC0 == 0x80 {
        // Not UTF-8 here anyway: cut at the limit.
        end = limit;
    }
    (&bytes[..end], true)
}

/// A far task's key hash (`kairos::far::KeyHasher`) as printed: 16 lowercase hex digits.
pub fn key_hash(hash: u64) -> String {
    format!("{hash:016x}")
}

/// A file's name (lossily), or the whole path if it has none.
pub fn file_name(path: &Path) -> Cow<'_, str> {
    match path.file_name() {
        Some(name) => name.to_string_lossy(),
        None => path.to_string_lossy(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(rfc3339(0).as_deref(), Some("1970-01-01T00:00:00.000Z"));
        assert_eq!(
            rfc3339(1_893_553_445_678).as_deref(),
            Some("2030-01-02T03:04:05.678Z")
        );
        assert_eq!(
            rfc3339(RFC3339_MS_MAX).as_deref(),
            Some("9999-12-31T23:59:59.999Z")
        );
        assert_eq!(rfc3339(RFC3339_MS_MAX + 1), None);
        assert_eq!(rfc3339(u64::MAX), None);
        // Leap days and century years, checked against `date -u -d @SECONDS`.
        for (ms, text) in [
            (951_782_400_000, "2000-02-29T00:00:00.000Z"),
            (978_307_199_000, "2000-12-31T23:59:59.000Z"),
            (1_709_164_800_000, "2024-02-29T00:00:00.000Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
        ] {
            assert_eq!(rfc3339(ms).as_deref(), Some(text), "{ms}");
        }
    }

    #[test]
    fn escaping() {
        assert_eq!(quoted(b"order:1"), "\"order:1\"");
        assert_eq!(quoted(b"a\"b\\c'd"), "\"a\\\"b\\\\c'd\"");
        assert_eq!(quoted(b"\n\x1b[31m\x00"), "\"\\n\\u{1b}[31m\\0\"");
        assert_eq!(quoted(b"\xff\xfeok\xc3\xa9"), "\"\\xff\\xfeok\u{e9}\"");
        assert_eq!(quoted("\u{202e}".as_bytes()), "\"\\u{202e}\"");
    }

    #[test]
    fn previews() {
        assert_eq!(preview(b"abcdef", None), (&b"abcdef"[..], false));
        assert_eq!(preview(b"abcdef", Some(6)), (&b"abcdef"[..], false));
        assert_eq!(preview(b"abcdef", Some(4)), (&b"abcd"[..], true));
        assert_eq!(preview(b"abcdef", Some(0)), (&b""[..], true));
        // "é" is c3 a9: a cut between them backs off to before it.
        assert_eq!(preview(b"ab\xc3\xa9", Some(3)), (&b"ab"[..], true));
        // Continuation bytes without a lead: cut at the limit.
        assert_eq!(
            preview(b"\x80\x80\x80\x80\x80\x80", Some(5)),
            (&b"\x80\x80\x80\x80\x80"[..], true)
        );
    }

    #[test]
    fn key_hashes() {
        assert_eq!(key_hash(0xffcb_7e86_9b80_484e), "ffcb7e869b80484e");
        assert_eq!(key_hash(0x1f), "000000000000001f");
        assert_eq!(key_hash(u64::MAX), "ffffffffffffffff");
    }

    #[test]
    fn type_names() {
        assert_eq!(type_name(RECORD_SCHEDULE), "SCHEDULE");
        assert_eq!(type_name(RECORD_RELEASE), "RELEASE");
        assert_eq!(type_name(42), "UNKNOWN(42)");
    }
}
