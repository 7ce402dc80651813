//! Small log images and the damage done to them, for the corruption matrix.
//!
//! Shared (by path) by `wal/tests/corruption_matrix.rs` (the log: `scan` and `Wal::open`),
//! the root crate's `tests/verify_matrix.rs` (the checking code of `kairos verify`, and the
//! binary itself) and `tests/fuzz_corpus.rs` (the seed corpus): every reader sees the same
//! images and the same damage, and one oracle ([`judge`]) decides each case.
//!
//! The records are Kairos record bodies (layout: `wal/FORMAT.md`, "Kairos record bodies"):
//! schedule two tasks, deliver and ack the first, cancel the second, and so on — every prefix
//! replays by the engine's rules, so an intact image verifies and a truncated one does too.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kairos_wal::format::{
    FrameHeader, FrameKind, MarkSlot, FRAME_HEADER_BYTES, MARK_SLOTS_OFFSET, MARK_SLOT_BYTES,
    MARK_SLOT_COUNT, SEGMENT_FRAMES_OFFSET, SEGMENT_SUFFIX,
};
use kairos_wal::{Durability, Lsn, Record, SimStorage, TornTail, Wal, WalError, WalOptions};

/// The log directory of every image.
pub const DIR: &str = "/data/wal";

/// Sector size at which the disk tears and at which the matrix zeroes.
pub const SECTOR: usize = 512;

pub fn dir() -> &'static Path {
    Path::new(DIR)
}

/// A record: (LSN, type, body).
pub type Rec = (u64, u8, Vec<u8>);

/// The files of a log directory: path → bytes.
pub type Files = BTreeMap<PathBuf, Vec<u8>>;

/// A log directory as the writer left it, and what is known about its records.
#[derive(Clone, Debug)]
pub struct Image {
    pub name: &'static str,
    pub files: Files,
    /// Every record appended, in LSN order (LSN = index + 1).
    pub records: Vec<Rec>,
    /// Every LSN up to this one was fdatasynced before the image was taken: no damage may
    /// lose one of them silently.
    pub synced: u64,
    /// The log was closed cleanly (`CLOSED` written).
    pub clean: bool,
    /// `SYNCED` records every synced LSN (the writer went idle after the last sync and wrote
    /// its idle high-water mark before the crash).
    pub marked: bool,
    /// The synced records were acknowledged with `WalOptions::proof_before_ack` (the
    /// default): a mark slot or `SYNCED` proves each of them, and names the newest segment.
    pub proven: bool,
}

impl Image {
    /// Whether damage that cuts off the last synced frames (or the newest segment) of this
    /// image cannot be told from a torn write: FORMAT.md's "Missing files" — an unclean
    /// shutdown with no high-water mark covering the synced records, which only a log opened
    /// without `proof_before_ack` leaves.
    pub fn blind_to_cut_synced_tail(&self) -> bool {
        !self.clean && !self.marked && !self.proven
    }

    /// Whether `SYNCED` names the newest segment (a roll or an idle sync recorded it there), so
    /// that deleting that segment is a missing segment, not a crash during its roll.
    pub fn synced_names_newest(&self) -> bool {
        let Some(newest) = self.segments().last().cloned() else {
            return false;
        };
        let name = newest.file_name().map(|n| n.to_string_lossy().into_owned());
        let newest_seq = name
            .and_then(|n| kairos_wal::format::parse_segment_file_name(&n))
            .map(|(seq, _)| seq);
        self.files
            .get(&dir().join("SYNCED"))
            .and_then(|bytes| kairos_wal::format::Synced::decode(bytes).ok())
            .is_some_and(|synced| Some(synced.seq) == newest_seq)
    }

    /// The highest LSN the newest segment's mark slots record as synced, if its first `len`
    /// bytes survive (0 when the slots are cut off: the segment then reads as unwritten).
    /// FORMAT.md, "Mark slots": a cut of synced frames below it is corruption, not a torn tail.
    pub fn newest_slot_mark(&self, len: usize) -> u64 {
        let Some(newest) = self.segments().last().cloned() else {
            return 0;
        };
        let bytes = &self.files[&newest];
        if len < SEGMENT_FRAMES_OFFSET || bytes.len() < SEGMENT_FRAMES_OFFSET {
            return 0;
        }
        let slots: Vec<MarkSlot> = (0..MARK_SLOT_COUNT)
            .map(|i| {
                let at = MARK_SLOTS_OFFSET + i * MARK_SLOT_BYTES;
                MarkSlot::decode(&bytes[at..at + MARK_SLOT_BYTES])
            })
            .collect();
        kairos_wal::format::slots_mark(&slots)
    }
}

const EPOCH_MS: u64 = 1_700_000_000_000;

fn schedule(id: u64, due_ms: u64, key: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&id.to_le_bytes());
    b.extend_from_slice(&due_ms.to_le_bytes());
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(payload);
    b
}

/// Record number `i` (from 1) of every image: groups of five — schedule task `a`, schedule
/// task `b`, deliver `a`, ack `a`, cancel `b`.
pub fn kairos_record(i: u64) -> (u8, Vec<u8>) {
    let group = (i - 1) / 5 + 1;
    let (a, b) = (2 * group - 1, 2 * group);
    let due = EPOCH_MS + group * 1000;
    match (i - 1) % 5 {
        0 => (
            1,
            schedule(
                a,
                due,
                format!("order:{a}:timeout").as_bytes(),
                format!("cancel unpaid order {a}").as_bytes(),
            ),
        ),
        1 => (
            1,
            schedule(
                b,
                due,
                format!("order:{b}:timeout").as_bytes(),
                format!("cancel unpaid order {b}").as_bytes(),
            ),
        ),
        2 => {
            let mut body = a.to_le_bytes().to_vec();
            body.extend_from_slice(&due.to_le_bytes());
            (3, body)
        }
        3 => (4, a.to_le_bytes().to_vec()),
        _ => (2, b.to_le_bytes().to_vec()),
    }
}

/// Appends records `range` in batches of 1, 1, 2, 1, 3, … records (one frame each), waiting
/// for each; returns what was appended.
fn append_records(wal: &Wal, range: std::ops::RangeInclusive<u64>) -> Result<Vec<Rec>, WalError> {
    const BATCHES: [u64; 5] = [1, 1, 2, 1, 3];
    let (mut next, last) = range.into_inner();
    let mut appended = Vec::new();
    let mut turn = 0;
    while next <= last {
        let n = BATCHES[turn % BATCHES.len()].min(last - next + 1);
        turn += 1;
        let bodies: Vec<(u8, Vec<u8>)> = (next..next + n).map(kairos_record).collect();
        let records: Vec<Record<'_>> = bodies
            .iter()
            .map(|(record_type, body)| Record {
                record_type: *record_type,
                body,
            })
            .collect();
        let ticket = wal.append(&records)?;
        assert_eq!(ticket.first_lsn(), Lsn(next));
        ticket.wait()?;
        for (k, (record_type, body)) in bodies.into_iter().enumerate() {
            appended.push((next + k as u64, record_type, body));
        }
        next += n;
    }
    Ok(appended)
}

fn open(sim: &SimStorage, durability: Durability, segment_bytes: u64) -> Result<Wal, WalError> {
    open_with(sim, durability, segment_bytes, true)
}

fn open_with(
    sim: &SimStorage,
    durability: Durability,
    segment_bytes: u64,
    proof_before_ack: bool,
) -> Result<Wal, WalError> {
    let options = WalOptions {
        durability,
        segment_bytes,
        proof_before_ack,
        ..WalOptions::default()
    };
    Ok(Wal::open(Arc::new(sim.clone()), dir(), options, &mut |_| Ok(()))?.0)
}

/// Every file of the image's directory.
pub fn files_of(sim: &SimStorage) -> Files {
    use kairos_wal::Storage;
    sim.list(dir())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|name| {
            let path = dir().join(name);
            sim.read_file(&path).map(|bytes| (path, bytes))
        })
        .collect()
}

/// A cleanly closed log: records 1..=n in 4 KiB segments (at least two), all synced.
pub fn closed_image(seed: u64, n: u64) -> Result<Image, WalError> {
    let sim = SimStorage::new(seed);
    let wal = open(&sim, Durability::Sync, 4096)?;
    let records = append_records(&wal, 1..=n)?;
    wal.close()?;
    Ok(Image {
        name: "closed",
        files: files_of(&sim),
        records,
        synced: n,
        clean: true,
        marked: false,
        proven: true,
    })
}

/// A log that crashed: records 1..=synced appended under `Sync` in 4 KiB segments (so the
/// older segments are sealed) and acknowledged with proof (the default options), the process
/// crashed; reopened under `Buffered` without proof (1 MiB segments: no roll, no sync, no
/// mark), records up to `n` appended, crashed again. Only 1..=synced are known durable; the newest segment holds both
/// kinds.
pub fn crashed_image(seed: u64, synced: u64, n: u64) -> Result<Image, WalError> {
    crashed(seed, synced, n, Marks::Proof)
}

/// As [`crashed_image`], but acknowledged without proof (`proof_before_ack: false`) and
/// crashed before any idle high-water mark: FORMAT.md's "Missing files", the damage this
/// opt-out cannot tell from a torn write.
pub fn crashed_unproven_image(seed: u64, synced: u64, n: u64) -> Result<Image, WalError> {
    crashed(seed, synced, n, Marks::None)
}

/// As [`crashed_unproven_image`], but the writer went idle after record `synced` and wrote
/// its idle high-water mark (`SYNCED`) before the first crash: the damage
/// `crashed_unproven_image` cannot tell from a torn write is refused here.
pub fn crashed_marked_image(seed: u64, synced: u64, n: u64) -> Result<Image, WalError> {
    crashed(seed, synced, n, Marks::Idle)
}

/// What records the synced LSNs of a crashed image.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Marks {
    /// `proof_before_ack`: every acknowledged LSN is proven.
    Proof,
    /// Neither proof nor the idle mark: only the slots, one sync behind.
    None,
    /// No proof; the idle high-water mark `SYNCED` written before the crash.
    Idle,
}

fn crashed(seed: u64, synced: u64, n: u64, marks: Marks) -> Result<Image, WalError> {
    let sim = SimStorage::new(seed);
    let marked = marks == Marks::Idle;
    let proven = marks == Marks::Proof;
    sim.set_timed_io(marked);
    let wal = open_with(&sim, Durability::Sync, 4096, proven)?;
    let mut records = append_records(&wal, 1..=synced)?;
    if marked {
        wait_for_synced_mark(&sim, dir(), synced);
    }
    drop(wal);
    sim.set_timed_io(false);
    // The unsynced tail, appended without proof: with it, this open would put every record
    // replayed in SYNCED, and the image would show that proof instead of the one each
    // acknowledgement left.
    let wal = open_with(&sim, Durability::Buffered, 1 << 20, false)?;
    records.extend(append_records(&wal, synced + 1..=n)?);
    drop(wal);
    Ok(Image {
        name: match marks {
            Marks::Proof => "crashed",
            Marks::None => "crashed-unproven",
            Marks::Idle => "crashed-marked",
        },
        files: files_of(&sim),
        records,
        synced,
        clean: false,
        marked,
        proven,
    })
}

/// Waits (polling, at most 30 s) until the writer of the log in `dir` on `sim` has recorded
/// LSN `lsn` as synced in `SYNCED`; panics if it does not. The writer does so
/// `synced_mark_delay` (default 10 ms) after its last sync, on its own thread.
pub fn wait_for_synced_mark(sim: &SimStorage, dir: &Path, lsn: u64) {
    let path = dir.join(kairos_wal::format::SYNCED_FILE_NAME);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let recorded = sim
            .read_file(&path)
            .and_then(|bytes| kairos_wal::format::Synced::decode(&bytes).ok())
            .map(|synced| synced.synced_lsn.0);
        if recorded == Some(lsn) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "SYNCED still records {recorded:?}, not LSN {lsn}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

impl Image {
    /// The segment files, oldest first.
    pub fn segments(&self) -> Vec<PathBuf> {
        segments_of(&self.files)
    }

    /// A fresh simulated disk holding `files`.
    pub fn sim(files: &Files) -> SimStorage {
        let sim = SimStorage::new(1);
        for (path, bytes) in files {
            sim.write_file(path, bytes);
        }
        sim
    }
}

pub fn segments_of(files: &Files) -> Vec<PathBuf> {
    files
        .keys()
        .filter(|p| p.to_string_lossy().ends_with(SEGMENT_SUFFIX))
        .cloned()
        .collect()
}

/// One frame of an intact image: where it is and which LSNs it holds.
#[derive(Clone, Debug)]
pub struct FrameSpan {
    pub file: PathBuf,
    pub offset: u64,
    pub end: u64,
    /// LSNs `first..first + records`.
    pub first: u64,
    pub records: u64,
}

/// Every frame of the image's segments, in log order (the image must be intact).
pub fn frames(image: &Image) -> Vec<FrameSpan> {
    let mut spans = Vec::new();
    for file in image.segments() {
        let bytes = &image.files[&file];
        let mut offset = SEGMENT_FRAMES_OFFSET;
        while offset + FRAME_HEADER_BYTES <= bytes.len() {
            let header = FrameHeader::parse(&bytes[offset..]);
            let end = offset + FRAME_HEADER_BYTES + header.body_bytes as usize;
            let records = if header.check_fields() == Ok(FrameKind::Data) {
                u64::from(header.record_count)
            } else {
                0
            };
            spans.push(FrameSpan {
                file: file.clone(),
                offset: offset as u64,
                end: end as u64,
                first: header.first_lsn,
                records,
            });
            offset = end;
        }
    }
    spans
}

/// One damaged directory.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub files: Files,
    /// A localised damage (bit flip, zeroed sector, cut): its file and its last damaged
    /// offset. A corruption error must name that file, at or before that offset.
    pub damage: Option<(PathBuf, u64)>,
    /// Records that must survive if the directory opens: `image.synced`, or fewer where
    /// FORMAT.md documents that the damage cannot be told from a crash ("Known limit").
    pub must_keep: u64,
    /// The case hits a documented blind spot (see `must_keep`).
    pub known_limit: bool,
}

impl std::fmt::Display for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

fn case(image: &Image, name: String, files: Files, damage: Option<(PathBuf, u64)>) -> Case {
    Case {
        name: format!("{}: {name}", image.name),
        files,
        damage,
        must_keep: image.synced,
        known_limit: false,
    }
}

/// Every file × every offset × each bit in `bits`, flipped alone.
pub fn for_each_bit_flip(image: &Image, bits: &[u8], mut f: impl FnMut(Case)) {
    for (path, original) in &image.files {
        for offset in 0..original.len() {
            for &bit in bits {
                let mut files = image.files.clone();
                if let Some(bytes) = files.get_mut(path) {
                    bytes[offset] ^= 1 << bit;
                }
                let name = format!("{} byte {offset} bit {bit} flipped", path.display());
                f(case(
                    image,
                    name,
                    files,
                    Some((path.clone(), offset as u64)),
                ));
            }
        }
    }
}

/// Every file cut at every length shorter than it.
///
/// Known limit (FORMAT.md, "Missing files"): after an unclean shutdown, cutting the newest
/// segment removes the frames that would prove its records synced; its mark slots (if the cut
/// keeps them) still prove every LSN up to the sync before the last. So a cut inside the
/// frames of the last sync opens with the records before the cut; those cases keep
/// `must_keep` at the records wholly before the cut (or the slot mark, if higher) and are
/// marked `known_limit`.
pub fn for_each_truncation(image: &Image, mut f: impl FnMut(Case)) {
    let spans = frames(image);
    let newest = image.segments().last().cloned();
    for (path, original) in &image.files {
        for cut in 0..original.len() {
            let mut files = image.files.clone();
            if let Some(bytes) = files.get_mut(path) {
                bytes.truncate(cut);
            }
            let name = format!("{} cut to {cut} bytes", path.display());
            let mut c = case(image, name, files, Some((path.clone(), cut as u64)));
            if image.blind_to_cut_synced_tail() && Some(path) == newest.as_ref() {
                let kept =
                    records_before(&spans, path, cut as u64).max(image.newest_slot_mark(cut));
                if kept < c.must_keep {
                    c.must_keep = kept;
                    c.known_limit = true;
                }
            }
            f(c);
        }
    }
}

/// The last LSN of the frames of `file` (and all older segments) that end at or before `at`.
fn records_before(spans: &[FrameSpan], file: &Path, at: u64) -> u64 {
    let mut last = 0;
    for span in spans {
        if span.file.as_path() == file && span.end > at {
            break;
        }
        if span.records > 0 {
            last = span.first + span.records - 1;
        }
    }
    last
}

/// Every 512-byte sector of every file zeroed alone.
pub fn for_each_zeroed_sector(image: &Image, mut f: impl FnMut(Case)) {
    for (path, original) in &image.files {
        for start in (0..original.len()).step_by(SECTOR) {
            let mut files = image.files.clone();
            let end = (start + SECTOR).min(original.len());
            if let Some(bytes) = files.get_mut(path) {
                bytes[start..end].fill(0);
            }
            let name = format!("{} sector at {start} zeroed", path.display());
            // A frame that starts inside the sector is damaged too.
            f(case(
                image,
                name,
                files,
                Some((path.clone(), end as u64 - 1)),
            ));
        }
    }
}

/// What a segment-level case must end in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Opens with every record.
    Everything,
    /// Opens, keeping at least `must_keep` records.
    Opens,
    /// Refused with this error kind.
    Refused(&'static str),
}

/// Whole-segment damage: delete, duplicate, reorder, a segment from another log, an empty
/// newest segment — each with the outcome it must have.
pub fn segment_cases(image: &Image, foreign: &Image) -> Vec<(Case, Expect)> {
    let segs = image.segments();
    assert!(
        segs.len() >= 2,
        "{}: the matrix needs two segments",
        image.name
    );
    let newest = segs[segs.len() - 1].clone();
    let mut cases = Vec::new();
    let mut push = |name: String, files: Files, expect: Expect, known_limit: Option<u64>| {
        let mut c = case(image, name, files, None);
        if let Some(keep) = known_limit {
            c.must_keep = keep;
            c.known_limit = true;
        }
        cases.push((c, expect));
    };
    let name_of = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let seq_name =
        |seq: u64, first: u64| dir().join(kairos_wal::format::segment_file_name(seq, Lsn(first)));
    let parsed = |p: &Path| {
        name_of(p)
            .and_then(|n| kairos_wal::format::parse_segment_file_name(&n))
            .map(|(seq, lsn)| (seq, lsn.0))
            .unwrap_or((0, 0))
    };
    let (newest_seq, newest_first) = parsed(&newest);

    for (i, seg) in segs.iter().enumerate() {
        let mut files = image.files.clone();
        files.remove(seg);
        let is_newest = i + 1 == segs.len();
        // Between two others or the oldest: the seq chain or the floor shows the gap; the
        // newest after a clean close: CLOSED does; after an idle sync or its roll: SYNCED does.
        let (expect, limit) =
            if !is_newest || !image.blind_to_cut_synced_tail() || image.synced_names_newest() {
                (Expect::Refused("MissingSegment"), None)
            } else {
                // Known limit: after an unclean shutdown, a deleted newest segment that no mark
                // names looks like a crash during the roll that would have created it.
                (Expect::Opens, Some(newest_first - 1))
            };
        push(
            format!("segment {} deleted", seg.display()),
            files,
            expect,
            limit,
        );
    }
    for seg in &segs {
        // The same bytes under the next free name: its header disagrees with the name.
        let mut files = image.files.clone();
        let copy = seq_name(newest_seq + 1, newest_first);
        files.insert(copy.clone(), image.files[seg].clone());
        push(
            format!("segment {} duplicated as {}", seg.display(), copy.display()),
            files,
            Expect::Refused("Corrupt"),
            None,
        );
        // A second file with the same seq and another first LSN.
        let (seq, first) = parsed(seg);
        let mut files = image.files.clone();
        files.insert(seq_name(seq, first + 1), image.files[seg].clone());
        push(
            format!("segment {} duplicated under the same seq", seg.display()),
            files,
            Expect::Refused("Corrupt"),
            None,
        );
    }
    for pair in segs.windows(2) {
        // Contents swapped, names kept.
        let mut files = image.files.clone();
        files.insert(pair[0].clone(), image.files[&pair[1]].clone());
        files.insert(pair[1].clone(), image.files[&pair[0]].clone());
        push(
            format!(
                "segments {} and {} swapped",
                pair[0].display(),
                pair[1].display()
            ),
            files,
            Expect::Refused("Corrupt"),
            None,
        );
    }
    let theirs = foreign.segments();
    for seg in &segs {
        // Another log's segment of the same name in place of ours.
        if let Some(other) = theirs.iter().find(|t| name_of(t) == name_of(seg)) {
            let mut files = image.files.clone();
            files.insert(seg.clone(), foreign.files[other].clone());
            push(
                format!("segment {} replaced by another log's", seg.display()),
                files,
                Expect::Refused("ForeignSegment"),
                None,
            );
        }
    }
    if let Some(other) = theirs.first() {
        // Another log's segment dropped in as our next segment.
        let mut files = image.files.clone();
        files.insert(seq_name(newest_seq + 1, 999), foreign.files[other].clone());
        push(
            "another log's segment dropped in as the newest".to_owned(),
            files,
            Expect::Refused("ForeignSegment"),
            None,
        );
    }
    {
        // An empty file as the next segment: a roll cut short — but the newest segment was
        // not sealed, so no roll was under way.
        let last_lsn = image.records.len() as u64;
        let mut files = image.files.clone();
        files.insert(seq_name(newest_seq + 1, last_lsn + 1), Vec::new());
        push(
            "empty segment after an unsealed newest segment".to_owned(),
            files,
            Expect::Refused("Corrupt"),
            None,
        );
    }
    {
        // The newest segment emptied (0 bytes): an unwritten segment. With CLOSED or SYNCED
        // covering its records, or SYNCED naming it (its roll completed, so its header was
        // durable): corrupt. Without, it is the known limit (looks like a crash while it was
        // being created).
        let mut files = image.files.clone();
        files.insert(newest.clone(), Vec::new());
        if !image.blind_to_cut_synced_tail() || image.synced_names_newest() {
            push(
                "newest segment emptied".to_owned(),
                files,
                Expect::Refused("Corrupt"),
                None,
            );
        } else {
            push(
                "newest segment emptied".to_owned(),
                files,
                Expect::Opens,
                Some(newest_first - 1),
            );
        }
        // The newest segment cut to its header and mark slots: its records are gone. Without
        // CLOSED or SYNCED, the slots still show those up to the sync before the last.
        let mut files = image.files.clone();
        if let Some(bytes) = files.get_mut(&newest) {
            bytes.truncate(SEGMENT_FRAMES_OFFSET);
        }
        if !image.blind_to_cut_synced_tail()
            || image.newest_slot_mark(SEGMENT_FRAMES_OFFSET) >= newest_first
        {
            push(
                "newest segment cut to its header".to_owned(),
                files,
                Expect::Refused("Corrupt"),
                None,
            );
        } else {
            push(
                "newest segment cut to its header".to_owned(),
                files,
                Expect::Opens,
                Some(newest_first - 1),
            );
        }
    }
    cases
}

/// How a case ended, once [`judge`] accepted it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Opened with the first `survivors` records; `torn` says whether a torn tail was
    /// reported (and, by `open`, truncated).
    Opened {
        survivors: u64,
        torn: Option<TornTail>,
    },
    /// Refused with a typed error naming `file` (and `offset` for corruption).
    Refused {
        kind: &'static str,
        file: PathBuf,
        offset: Option<u64>,
    },
}

/// The oracle: checks one reader's result for a case and classifies it. Panics (naming the
/// case) on any violation — an untyped error, an error naming no file of the directory or
/// an offset past its end, records that are not the appended prefix, a synced record lost
/// (beyond the documented limits), a loss not reported as a torn tail when bytes were cut
/// from inside a frame, or a corruption error that does not name the damaged file at or
/// before the damage.
pub fn judge(
    image: &Image,
    case: &Case,
    result: Result<(Option<TornTail>, Vec<Rec>), WalError>,
) -> Outcome {
    match result {
        Ok((torn, replayed)) => {
            let m = replayed.len();
            assert!(
                m <= image.records.len() && replayed[..] == image.records[..m],
                "{case}: the records read are not a prefix of those appended"
            );
            let m = m as u64;
            assert!(
                m >= case.must_keep,
                "{case}: synced records {}..={} silently dropped (torn tail {torn:?})",
                m + 1,
                case.must_keep
            );
            if let Some(t) = &torn {
                assert_eq!(t.first_lost_lsn, Lsn(m + 1), "{case}: {t:?}");
                assert!(case.files.contains_key(&t.file), "{case}: {t:?}");
                let len = case.files[&t.file].len() as u64;
                assert!(
                    t.offset <= len && t.bytes_truncated == len - t.offset,
                    "{case}: {t:?}"
                );
            }
            Outcome::Opened { survivors: m, torn }
        }
        Err(error) => {
            let (kind, file, offset) = match &error {
                WalError::Corrupt { file, offset, .. } => ("Corrupt", file, Some(*offset)),
                WalError::MissingSegment { file, .. } => ("MissingSegment", file, None),
                WalError::ForeignSegment { file } => ("ForeignSegment", file, None),
                WalError::UnsupportedVersion { file, .. } => ("UnsupportedVersion", file, None),
                other => panic!("{case}: untyped error: {other}"),
            };
            assert!(
                file.parent() == Some(dir()),
                "{case}: {error} names a file outside the directory"
            );
            if let Some(offset) = offset {
                let len = case.files.get(file).map_or(0, |b| b.len() as u64);
                assert!(
                    offset <= len,
                    "{case}: {error}: offset past the end ({len} bytes)"
                );
            }
            if let (Some((damaged, at)), "Corrupt") = (&case.damage, kind) {
                assert_eq!(file, damaged, "{case}: {error} names another file");
                assert!(
                    offset.is_some_and(|o| o <= *at),
                    "{case}: {error}: reported after the damage at {at}"
                );
            }
            Outcome::Refused {
                kind,
                file: file.clone(),
                offset,
            }
        }
    }
}

/// Checks a segment-level case's outcome against what it must be.
pub fn expect(case: &Case, expected: Expect, outcome: &Outcome, image: &Image) {
    match (expected, outcome) {
        (Expect::Everything, Outcome::Opened { survivors, .. }) => {
            assert_eq!(*survivors, image.records.len() as u64, "{case}");
        }
        (Expect::Opens, Outcome::Opened { .. }) => {}
        (Expect::Refused(kind), Outcome::Refused { kind: got, .. }) if kind == *got => {}
        _ => panic!("{case}: expected {expected:?}, got {outcome:?}"),
    }
}

/// The log's own readers on a case: `scan` (read-only) and, if `with_open`, `Wal::open`
/// too, which must agree with it. Returns scan's result in [`judge`]'s form.
pub fn scan_case(case: &Case, with_open: bool) -> Result<(Option<TornTail>, Vec<Rec>), WalError> {
    let sim = Image::sim(&case.files);
    let mut seen = Vec::new();
    let scanned = kairos_wal::scan(
        &sim,
        dir(),
        kairos_wal::RECORD_BYTES_MAX_DEFAULT,
        &mut |r| seen.push((r.lsn.0, r.record_type, r.body.to_vec())),
    )
    .map(|report| (report.torn_tail, seen));
    if with_open {
        let mut replayed = Vec::new();
        let opened = Wal::open(
            Arc::new(sim.clone()),
            dir(),
            WalOptions::default(),
            &mut |r| {
                replayed.push((r.lsn.0, r.record_type, r.body.to_vec()));
                Ok(())
            },
        );
        match (&scanned, opened) {
            (Ok((torn, seen)), Ok((wal, report))) => {
                assert_eq!(&report.torn_tail, torn, "{case}: open and scan disagree");
                assert_eq!(
                    &replayed, seen,
                    "{case}: open and scan read different records"
                );
                if let Some(t) = torn {
                    let len = sim.read_file(&t.file).map_or(0, |b| b.len() as u64);
                    if t.offset > 0 {
                        assert_eq!(len, t.offset, "{case}: open did not truncate the torn tail");
                    }
                }
                drop(wal);
            }
            (Err(a), Err(b)) => assert_eq!(
                std::mem::discriminant(a),
                std::mem::discriminant(&b),
                "{case}: scan: {a}; open: {b}"
            ),
            (a, b) => panic!(
                "{case}: scan {:?} but open {:?}",
                a.as_ref().map(|x| &x.0),
                b.map(|x| x.1)
            ),
        }
    }
    scanned
}
