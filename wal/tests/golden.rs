//! The encoder against the hex vectors of FORMAT.md (read from the file itself), and the
//! decoder against the same bytes.

use kairos_wal::format::{
    decode_meta, encode_frame, encode_meta, encode_record, frame_crc, Closed, FrameHeader,
    FrameKind, HeaderError, MarkSlot, SegmentHeader, Synced, Trim, BOUND_FILE_BYTES,
    FORMAT_VERSION, FRAME_HEADER_BYTES, MARK_SLOT_BYTES, META_BYTES, SEGMENT_FORMAT_VERSION,
    SEGMENT_HEADER_BYTES,
};
use kairos_wal::{Lsn, RECORD_BYTES_MAX_DEFAULT};

const FORMAT_MD: &str = include_str!("../FORMAT.md");

/// The bytes of the hex block right after `<!-- golden:NAME -->` in FORMAT.md.
fn golden(name: &str) -> Vec<u8> {
    let marker = format!("<!-- golden:{name} -->");
    let start = FORMAT_MD
        .find(&marker)
        .unwrap_or_else(|| panic!("FORMAT.md has no {marker}"));
    let rest = &FORMAT_MD[start + marker.len()..];
    let block = rest
        .split("```text")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no hex block after {marker}"));
    block
        .split_whitespace()
        .map(|h| u8::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex {h:?} in {name}")))
        .collect()
}

fn store_id() -> [u8; 16] {
    core::array::from_fn(|i| i as u8)
}

#[test]
fn meta_matches_format_md() {
    let bytes = golden("meta");
    assert_eq!(bytes.len(), META_BYTES);
    assert_eq!(encode_meta(&store_id()).as_slice(), bytes.as_slice());
    assert_eq!(decode_meta(&bytes), Ok(store_id()));
}

#[test]
fn segment_header_matches_format_md() {
    let header = SegmentHeader {
        format_version: SEGMENT_FORMAT_VERSION,
        store_id: store_id(),
        seq: 1,
        prev_last_lsn: 0,
        created_ms: 1_700_000_000_000,
    };
    let bytes = golden("segment-header");
    assert_eq!(bytes.len(), SEGMENT_HEADER_BYTES);
    assert_eq!(header.encode().as_slice(), bytes.as_slice());
    assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 2);
    assert_eq!(header.frames_offset(), 128);

    // Version 1 (no mark slots) is still read, and encodes as it always did.
    let v1 = SegmentHeader {
        format_version: 1,
        ..header
    };
    let bytes = golden("segment-header-v1");
    assert_eq!(v1.encode().as_slice(), bytes.as_slice());
    assert_eq!(SegmentHeader::decode(&bytes), Ok(v1));
    assert_eq!(v1.frames_offset(), 64);
}

#[test]
fn mark_slot_matches_format_md() {
    let bytes = golden("mark-slot");
    assert_eq!(bytes.len(), MARK_SLOT_BYTES);
    assert_eq!(MarkSlot::encode(1, 17).as_slice(), bytes.as_slice());
    assert_eq!(
        MarkSlot::decode(&bytes),
        MarkSlot::Mark {
            synced_lsn: 17,
            seq: 1
        }
    );
}

#[test]
fn data_frame_matches_format_md() {
    let mut body = Vec::new();
    encode_record(&mut body, 1, b"hello");
    encode_record(&mut body, 2, b"");
    let bytes = golden("data-frame");
    assert_eq!(encode_frame(FrameKind::Data, 2, 1, 0, &body), bytes);

    let header = FrameHeader::parse(&bytes);
    assert_eq!(header.body_bytes, 15);
    assert_eq!(header.record_count, 2);
    assert_eq!((header.first_lsn, header.synced_lsn), (1, 0));
    assert_eq!(header.check_fields(), Ok(FrameKind::Data));
    let (head, body) = bytes.split_at(FRAME_HEADER_BYTES);
    assert_eq!(frame_crc(head, body), header.crc);
    let mut records = Vec::new();
    let walked = kairos_wal::format::for_each_record(
        body,
        header.record_count,
        RECORD_BYTES_MAX_DEFAULT,
        |index, record_type, record_body| -> Result<(), ()> {
            records.push((index, record_type, record_body.to_vec()));
            Ok(())
        },
    );
    assert_eq!(walked, Ok(Ok(())));
    assert_eq!(records, vec![(0, 1, b"hello".to_vec()), (1, 2, Vec::new())]);
}

#[test]
fn control_frames_match_format_md() {
    for (name, kind) in [
        ("mark-frame", FrameKind::Mark),
        ("seal-frame", FrameKind::Seal),
        ("close-frame", FrameKind::Close),
    ] {
        let bytes = golden(name);
        assert_eq!(encode_frame(kind, 0, 3, 2, &[]), bytes, "{name}");
        let header = FrameHeader::parse(&bytes);
        assert_eq!(header.check_fields(), Ok(kind), "{name}");
        assert_eq!(frame_crc(&bytes, &[]), header.crc, "{name}");
    }
}

#[test]
fn trim_matches_format_md() {
    let trim = Trim {
        store_id: store_id(),
        seq: 5,
        first_lsn: Lsn(101),
    };
    let bytes = golden("trim");
    assert_eq!(bytes.len(), BOUND_FILE_BYTES);
    assert_eq!(trim.encode().as_slice(), bytes.as_slice());
    assert_eq!(Trim::decode(&bytes), Ok(trim));
    assert_eq!(&bytes[..8], b"KAIROSTR");
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), FORMAT_VERSION);
    // A CLOSED file is not a TRIM file, and the other way round.
    assert_eq!(Closed::decode(&bytes), Err(HeaderError::BadMagic));
}

#[test]
fn closed_matches_format_md() {
    let closed = Closed {
        store_id: store_id(),
        seq: 7,
        last_lsn: Lsn(200),
    };
    let bytes = golden("closed");
    assert_eq!(bytes.len(), BOUND_FILE_BYTES);
    assert_eq!(closed.encode().as_slice(), bytes.as_slice());
    assert_eq!(Closed::decode(&bytes), Ok(closed));
    assert_eq!(&bytes[..8], b"KAIROSCL");
    assert_eq!(Trim::decode(&bytes), Err(HeaderError::BadMagic));
}

#[test]
fn bound_files_reject_damage_and_forbidden_values() {
    let trim = Trim {
        store_id: store_id(),
        seq: 5,
        first_lsn: Lsn(101),
    };
    let good = trim.encode();
    for offset in 0..good.len() {
        let mut bytes = good;
        bytes[offset] ^= 0x10;
        assert!(Trim::decode(&bytes).is_err(), "flip at {offset} accepted");
    }
    assert_eq!(Trim::decode(&good[..47]), Err(HeaderError::Short));
    let mut long = good.to_vec();
    long.push(0);
    assert!(Trim::decode(&long).is_err());
    let mut future = good;
    future[8] = 2;
    assert_eq!(
        Trim::decode(&future),
        Err(HeaderError::UnsupportedVersion(2))
    );
    for bad in [
        Trim { seq: 0, ..trim },
        Trim {
            first_lsn: Lsn(0),
            ..trim
        },
    ] {
        assert!(matches!(
            Trim::decode(&bad.encode()),
            Err(HeaderError::Invalid(_))
        ));
    }
    // CLOSED may record LSN 0 (a log closed before its first append), never seq 0.
    let empty = Closed {
        store_id: store_id(),
        seq: 1,
        last_lsn: Lsn(0),
    };
    assert_eq!(Closed::decode(&empty.encode()), Ok(empty));
    let zero_seq = Closed { seq: 0, ..empty };
    assert!(Closed::decode(&zero_seq.encode()).is_err());
}

#[test]
fn synced_matches_format_md() {
    let synced = Synced {
        store_id: store_id(),
        seq: 9,
        synced_lsn: Lsn(300),
    };
    let bytes = golden("synced");
    assert_eq!(bytes.len(), BOUND_FILE_BYTES);
    assert_eq!(synced.encode().as_slice(), bytes.as_slice());
    assert_eq!(Synced::decode(&bytes), Ok(synced));
    assert_eq!(&bytes[..8], b"KAIROSSY");
    // The three bound files are told apart by their magic.
    assert_eq!(Closed::decode(&bytes), Err(HeaderError::BadMagic));
    assert_eq!(Trim::decode(&bytes), Err(HeaderError::BadMagic));
    assert_eq!(
        Synced::decode(&golden("closed")),
        Err(HeaderError::BadMagic)
    );
}
