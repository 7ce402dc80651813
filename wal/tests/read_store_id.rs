//! `read_store_id`: the one reader of a log directory's `META` (the log's open, the engine's
//! checkpoint check and the CLI use it), on every kind of file it may find.

mod common;

use std::path::PathBuf;

use common::*;
use kairos_wal::format::{
    encode_meta, StoreId, FORMAT_VERSION, META_BYTES, META_CRC_OFFSET, META_FLAGS_OFFSET,
    META_VERSION_OFFSET,
};
use kairos_wal::{
    read_store_id, Durability, FaultKind, FaultOp, FaultPlan, SimStorage, Storage, WalError,
};

const ID: StoreId = [0x5A; 16];

fn meta() -> PathBuf {
    dir().join("META")
}

/// `encode_meta(ID)` with `edit` applied and the CRC recomputed (so only the edit is wrong).
fn meta_with(edit: impl FnOnce(&mut [u8; META_BYTES])) -> [u8; META_BYTES] {
    let mut b = encode_meta(&ID);
    edit(&mut b);
    let crc = crc32fast::hash(&b[..META_CRC_OFFSET]);
    b[META_CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// `read_store_id` on a directory whose `META` holds `bytes`: the `Corrupt` reason (file
/// and offset checked), and how many storage operations it took.
fn corrupt_reason(bytes: &[u8]) -> Result<(String, u64), String> {
    let sim = SimStorage::new(1);
    sim.write_file(&meta(), bytes);
    let before = sim.io_ops();
    match read_store_id(&sim, dir()) {
        Err(WalError::Corrupt {
            file,
            offset,
            reason,
        }) => {
            assert_eq!((file, offset), (meta(), 0));
            Ok((reason, sim.io_ops() - before))
        }
        other => Err(format!(
            "{} bytes: expected Corrupt, got {other:?}",
            bytes.len()
        )),
    }
}

#[test]
fn a_valid_meta_gives_its_store_id() -> TestResult {
    let sim = SimStorage::new(1);
    sim.write_file(&meta(), &encode_meta(&ID));
    let before = sim.io_ops();
    assert_eq!(read_store_id(&sim, dir())?, Some(ID));
    // stat (exists), open, stat (length), one read.
    assert_eq!(sim.io_ops() - before, 4);
    Ok(())
}

#[test]
fn the_store_id_is_the_one_the_log_opens_with() -> TestResult {
    let sim = SimStorage::new(2);
    let (wal, _, _) = open(&sim, options(Durability::Sync, 1 << 20))?;
    let id = wal.store_id();
    wal.close()?;
    assert_eq!(read_store_id(&sim, dir())?, Some(id));
    Ok(())
}

#[test]
fn a_missing_meta_or_directory_is_none() -> TestResult {
    let sim = SimStorage::new(1);
    assert_eq!(read_store_id(&sim, dir())?, None);
    sim.create_dir_all(dir())?;
    assert_eq!(read_store_id(&sim, dir())?, None);
    Ok(())
}

/// A file of the wrong length is refused before any byte of it is read: the length is the
/// first thing checked (stat, open, stat: 3 operations, no read), whatever its size.
#[test]
fn a_meta_of_the_wrong_length_is_corrupt_and_not_read() -> TestResult {
    let long = [encode_meta(&ID).as_slice(), &[0u8]].concat();
    for (bytes, len) in [
        (Vec::new(), 0),
        (encode_meta(&ID)[..META_BYTES - 1].to_vec(), 31),
        (long, 33),
        (vec![0xFF; 1 << 20], 1 << 20),
    ] {
        let (reason, ops) = corrupt_reason(&bytes)?;
        assert_eq!(reason, format!("META is {len} bytes, expected 32"));
        assert_eq!(ops, 3, "{len} bytes");
    }
    Ok(())
}

#[test]
fn a_damaged_meta_is_corrupt() -> TestResult {
    let mut bad_magic = encode_meta(&ID);
    bad_magic[0] ^= 0x01;
    let mut bad_crc = encode_meta(&ID);
    bad_crc[META_CRC_OFFSET] ^= 0x01;
    let mut bad_id = encode_meta(&ID);
    bad_id[20] ^= 0x01;
    let flags = meta_with(|b| b[META_FLAGS_OFFSET] = 1);
    for (bytes, expected) in [
        (bad_magic, "invalid META: wrong magic"),
        (bad_crc, "invalid META: header checksum mismatch"),
        (bad_id, "invalid META: header checksum mismatch"),
        (flags, "invalid META: META flags are not 0"),
        ([0u8; META_BYTES], "invalid META: wrong magic"),
    ] {
        assert_eq!(corrupt_reason(&bytes)?.0, expected);
    }
    Ok(())
}

#[test]
fn a_meta_of_an_unknown_version_is_unsupported() -> TestResult {
    let sim = SimStorage::new(1);
    let version = FORMAT_VERSION + 1;
    sim.write_file(
        &meta(),
        &meta_with(|b| {
            b[META_VERSION_OFFSET..META_FLAGS_OFFSET].copy_from_slice(&version.to_le_bytes())
        }),
    );
    match read_store_id(&sim, dir()) {
        Err(WalError::UnsupportedVersion { file, version: v }) => {
            assert_eq!((file, v), (meta(), version));
        }
        other => return Err(format!("expected UnsupportedVersion, got {other:?}").into()),
    }
    Ok(())
}

/// Each storage operation failing is an `Io` error naming it and `META`.
#[test]
fn an_io_error_is_reported_with_its_operation() -> TestResult {
    for (after, op) in [(0, "stat"), (1, "open"), (2, "stat"), (3, "read")] {
        let sim = SimStorage::new(1);
        sim.write_file(&meta(), &encode_meta(&ID));
        sim.inject(FaultPlan {
            after,
            op: FaultOp::Any,
            kind: FaultKind::Eio,
        });
        match read_store_id(&sim, dir()) {
            Err(WalError::Io { op: o, path, .. }) => assert_eq!((o, path), (op, meta())),
            other => return Err(format!("fault {after}: expected Io, got {other:?}").into()),
        }
    }
    Ok(())
}
