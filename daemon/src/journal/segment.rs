//! The journal's on-disk format: segment files of checksummed records, and
//! reading them back (records in order, gaps and damage reported, never
//! garbage).
//!
//! A segment is named by the sequence number of its first record,
//! `<seq, 20 digits>.wpj`, and holds:
//!
//! ```text
//! header   8 bytes  magic "WPDJRNL1"
//!          8 bytes  first sequence number (u64 LE), the same as the name
//! record   4 bytes  payload length (u32 LE)
//!          4 bytes  CRC-32 of the 16 bytes below and the payload (u32 LE)
//!          8 bytes  sequence number (u64 LE)
//!          8 bytes  publish time, Unix ns (u64 LE)
//!          n bytes  payload (the event, protobuf-encoded by the RPC layer)
//! ```
//!
//! A record is valid when its bytes are all there, its CRC matches, its
//! payload is at most [`MAX_PAYLOAD`] bytes and its sequence number is above
//! the previous record's and at most [`MAX_SEQ`]. A torn write (a crash in
//! the middle of a batch) leaves an incomplete or mismatching record at the
//! tail of the newest segment: [`scan`] finds where the last valid record
//! ends and the journal cuts the rest off before appending.
//!
//! Everything read back is treated as hostile (a damaged disk, a forged
//! file): a segment whose header is wrong or names another first sequence
//! number than its file name is not read; bytes that do not decode are
//! skipped up to the next offset where a whole valid record starts (so a
//! damaged stretch loses only itself, never the records after it); no
//! length field is trusted for an allocation (at most one record and one
//! read of [`READ_CHUNK`] bytes are held at once).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Magic at the start of every segment.
pub const MAGIC: &[u8; 8] = b"WPDJRNL1";
/// Bytes of a segment's header.
pub const HEADER_LEN: u64 = 16;
/// Bytes of a record's header (length, CRC, seq, time).
pub const RECORD_HEADER_LEN: usize = 24;
/// Largest payload accepted when reading: an event is a few hundred bytes;
/// a larger length field is damage, not an event.
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// File name extension of segments.
pub const EXTENSION: &str = "wpj";
/// Largest sequence number accepted when reading (a segment's name or
/// header, a record): 2^63 - 1, which a daemon publishing a billion events
/// a second reaches in 292 years. A larger one is damage, and leaves room
/// for `seq + 1` everywhere.
pub const MAX_SEQ: u64 = i64::MAX as u64;
/// Bytes read from a segment at once.
pub const READ_CHUNK: usize = 1 << 20;

/// A record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Sequence number.
    pub seq: u64,
    /// Publish time (Unix ns).
    pub time_ns: u64,
    /// The encoded event.
    pub payload: Vec<u8>,
}

/// Appends the record of one event to `buf`.
pub fn encode_record(buf: &mut Vec<u8>, seq: u64, time_ns: u64, payload: &[u8]) {
    append_record(buf, seq, time_ns, |b| b.extend_from_slice(payload));
}

/// Appends the record of one event to `buf`, its payload written in place
/// by `payload` (which only appends): no copy of the payload is made.
pub fn append_record(
    buf: &mut Vec<u8>,
    seq: u64,
    time_ns: u64,
    payload: impl FnOnce(&mut Vec<u8>),
) {
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]);
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&time_ns.to_le_bytes());
    payload(buf);
    let len = buf.len() - start - RECORD_HEADER_LEN;
    let len = u32::try_from(len).expect("an event is far below 4 GiB");
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The header of a segment whose first record is `first_seq`.
pub fn header(first_seq: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..].copy_from_slice(&first_seq.to_le_bytes());
    h
}

/// File name of the segment starting at `first_seq`.
pub fn file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.{EXTENSION}")
}

/// The first sequence number a segment file name stands for.
pub fn parse_name(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(EXTENSION)?.strip_suffix('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok().filter(|&s| s <= MAX_SEQ)
}

/// A segment file on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentFile {
    /// Sequence number of its first record (from its name).
    pub first_seq: u64,
    /// Its path.
    pub path: PathBuf,
}

/// The segments in `dir`, oldest first. Files that are not segments are
/// left alone (one named like a segment but with a number out of range is
/// reported).
pub fn list(dir: &Path) -> io::Result<Vec<SegmentFile>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        match name.to_str().and_then(parse_name) {
            Some(first_seq) => out.push(SegmentFile {
                first_seq,
                path: entry.path(),
            }),
            None if name
                .to_str()
                .is_some_and(|n| n.ends_with(&format!(".{EXTENSION}"))) =>
            {
                tracing::warn!(
                    file = %entry.path().display(),
                    "journal: a file named like a segment but not one (its number is malformed \
                     or out of range) is ignored"
                );
            }
            None => {}
        }
    }
    out.sort_by_key(|s| s.first_seq);
    Ok(out)
}

/// Why reading a record stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The bytes end exactly after the last record.
    End,
    /// The bytes end inside a record (a torn tail, or a write under way).
    Truncated,
    /// A record's length, checksum or sequence number is wrong.
    Damaged,
}

/// Decodes the record at the start of `bytes`: the record and its length
/// in bytes, or why there is none. `after` is the previous record's
/// sequence number (a valid record's is above it).
pub fn decode_record(bytes: &[u8], after: u64) -> Result<(Record, usize), Stop> {
    if bytes.is_empty() {
        return Err(Stop::End);
    }
    if bytes.len() < RECORD_HEADER_LEN {
        return Err(Stop::Truncated);
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap());
    let len = u32_at(0);
    if len > MAX_PAYLOAD {
        return Err(Stop::Damaged);
    }
    let total = RECORD_HEADER_LEN + len as usize;
    if bytes.len() < total {
        return Err(Stop::Truncated);
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[8..total]);
    if crc.finalize() != u32_at(4) {
        return Err(Stop::Damaged);
    }
    let seq = u64_at(8);
    if seq <= after || seq > MAX_SEQ {
        return Err(Stop::Damaged);
    }
    Ok((
        Record {
            seq,
            time_ns: u64_at(16),
            payload: bytes[RECORD_HEADER_LEN..total].to_vec(),
        },
        total,
    ))
}

/// What [`scan`] found in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// Bytes up to the end of the last valid record (the header's if there
    /// is none; 0 if the header itself is wrong).
    pub valid_len: u64,
    /// The file's length.
    pub file_len: u64,
    /// Valid records.
    pub records: u64,
    /// Sequence number of the last valid record (None: no record).
    pub last_seq: Option<u64>,
    /// How the file ends after the last valid record (End: right there).
    pub stop: Stop,
    /// Bytes of damage skipped between valid records (kept: the records
    /// after them are good).
    pub damaged: u64,
}

/// Reads a segment through (never more than a record and a chunk in
/// memory) and finds its valid records. A file whose header is missing,
/// wrong, or names another first sequence number than `first_seq` (from its
/// name) has a valid prefix of 0 bytes.
pub fn scan(path: &Path, first_seq: u64) -> io::Result<Scan> {
    let file_len = std::fs::symlink_metadata(path)?.len();
    let mut r = match SegmentReader::open(path, first_seq) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return Ok(Scan {
                valid_len: 0,
                file_len,
                records: 0,
                last_seq: None,
                stop: if file_len == 0 {
                    Stop::End
                } else {
                    Stop::Damaged
                },
                damaged: 0,
            });
        }
        Err(e) => return Err(e),
    };
    let mut records = 0;
    let mut last_seq = None;
    let stop = loop {
        match r.next(None)? {
            Ok(rec) => {
                records += 1;
                last_seq = Some(rec.seq);
            }
            Err(stop) => break stop,
        }
    };
    let valid_len = r.good_end();
    Ok(Scan {
        valid_len,
        file_len,
        records,
        last_seq,
        stop: if valid_len == file_len {
            Stop::End
        } else {
            stop
        },
        damaged: r.damaged(),
    })
}

/// The time of a segment's first record, if it has a valid one.
pub fn first_time(path: &Path, first_seq: u64) -> io::Result<Option<u64>> {
    let mut r = match SegmentReader::open(path, first_seq) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(r.next(None)?.ok().map(|rec| rec.time_ns))
}

/// Reads records of one segment sequentially, up to a limit of bytes the
/// writer has finished writing (so a batch being written is never seen
/// half-way). Damage is skipped: the reader moves on byte by byte to the
/// next offset where a whole valid record starts.
#[derive(Debug)]
pub struct SegmentReader {
    file: File,
    /// Offset of the next record (or candidate, while skipping damage).
    at: u64,
    /// Bytes read ahead and not yet decoded.
    buf: Vec<u8>,
    /// Offset of `buf[0]`.
    buf_at: u64,
    /// Sequence number of the last record returned.
    last: u64,
    /// Where the last record returned ends.
    good_end: u64,
    /// Bytes skipped since the last record returned.
    skipping: u64,
    /// Bytes skipped between records returned.
    damaged: u64,
}

impl SegmentReader {
    /// Opens `path`, checking its header: the magic, and `first_seq` (the
    /// number its name gives). A wrong or short header is `InvalidData`.
    pub fn open(path: &Path, first_seq: u64) -> io::Result<Self> {
        let mut file = crate::statedir::open(path, std::fs::OpenOptions::new().read(true))?;
        let bad = |why: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a journal segment: {why}", path.display()),
            )
        };
        let mut h = [0u8; HEADER_LEN as usize];
        match file.read_exact(&mut h) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(bad("shorter than its header"));
            }
            Err(e) => return Err(e),
        }
        if &h[..8] != MAGIC {
            return Err(bad("wrong magic"));
        }
        let first = u64::from_le_bytes(h[8..].try_into().unwrap());
        if first != first_seq {
            return Err(bad(&format!(
                "its header names sequence number {first}, its file name {first_seq}"
            )));
        }
        file.seek(SeekFrom::Start(HEADER_LEN))?;
        Ok(SegmentReader {
            file,
            at: HEADER_LEN,
            buf: Vec::new(),
            buf_at: HEADER_LEN,
            last: first.saturating_sub(1),
            good_end: HEADER_LEN,
            skipping: 0,
            damaged: 0,
        })
    }

    /// The next valid record among the first `limit` bytes of the file
    /// (None for no limit), or why there is none: `End` (nothing more),
    /// `Truncated` (bytes that hold no valid record up to the end or the
    /// limit: a torn tail).
    pub fn next(&mut self, limit: Option<u64>) -> io::Result<Result<Record, Stop>> {
        // Nothing more to read up to the limit or the end of the file.
        let mut exhausted = false;
        loop {
            let start = (self.at - self.buf_at) as usize;
            match decode_record(&self.buf[start..], self.last) {
                Ok((r, n)) => {
                    if limit.is_some_and(|l| self.at + n as u64 > l) {
                        return Ok(Err(Stop::End));
                    }
                    self.at += n as u64;
                    self.last = r.seq;
                    self.good_end = self.at;
                    self.damaged += self.skipping;
                    self.skipping = 0;
                    return Ok(Ok(r));
                }
                Err(Stop::End) if exhausted => {
                    return Ok(Err(if self.skipping > 0 {
                        Stop::Truncated
                    } else {
                        Stop::End
                    }));
                }
                Err(Stop::End | Stop::Truncated) if !exhausted => {
                    exhausted = self.refill(start, limit)?;
                }
                // Damage, or bytes that end before the record they start:
                // skip one and look for a valid record after it.
                Err(_) => {
                    self.at += 1;
                    self.skipping += 1;
                }
            }
        }
    }

    /// Drops the decoded bytes before `start` and reads more after the
    /// rest: true when there was nothing more to read.
    fn refill(&mut self, start: usize, limit: Option<u64>) -> io::Result<bool> {
        self.buf.drain(..start);
        self.buf_at = self.at;
        let end = self.buf_at + self.buf.len() as u64;
        let want = match limit {
            Some(l) if l <= end => 0,
            Some(l) => (l - end).min(READ_CHUNK as u64) as usize,
            None => READ_CHUNK,
        };
        if want == 0 {
            return Ok(true);
        }
        let old = self.buf.len();
        self.buf.resize(old + want, 0);
        let n = self.file.read_at(&mut self.buf[old..], end)?;
        self.buf.truncate(old + n);
        Ok(n == 0)
    }

    /// Sequence number of the last record returned.
    pub fn last_seq(&self) -> u64 {
        self.last
    }

    /// Where the last record returned ends (the header's end before one).
    pub fn good_end(&self) -> u64 {
        self.good_end
    }

    /// Bytes of damage skipped between the records returned so far.
    pub fn damaged(&self) -> u64 {
        self.damaged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn segment(dir: &Path, first: u64, seqs: &[u64]) -> PathBuf {
        let mut buf = header(first).to_vec();
        for &s in seqs {
            encode_record(&mut buf, s, s * 10, format!("event {s}").as_bytes());
        }
        let p = dir.join(file_name(first));
        std::fs::write(&p, &buf).unwrap();
        p
    }

    fn tmp() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "wpd-seg-{}-{}",
            std::process::id(),
            crate::clock::monotonic_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn names_round_trip_and_strangers_are_ignored() {
        assert_eq!(parse_name(&file_name(42)), Some(42));
        assert_eq!(parse_name("42.wpj"), None);
        assert_eq!(parse_name("0000000000000000004x.wpj"), None);
        assert_eq!(parse_name(&file_name(7).replace("wpj", "tmp")), None);
        assert_eq!(parse_name(&file_name(MAX_SEQ)), Some(MAX_SEQ));
        assert_eq!(parse_name(&file_name(MAX_SEQ + 1)), None, "out of range");
        assert_eq!(parse_name("99999999999999999999.wpj"), None, "not a u64");
        let d = tmp();
        segment(&d, 11, &[11, 12]);
        segment(&d, 1, &[1, 2, 3]);
        std::fs::write(d.join("notes.txt"), "x").unwrap();
        std::fs::write(d.join(file_name(u64::MAX)), "x").unwrap();
        let l = list(&d).unwrap();
        assert_eq!(
            l.iter().map(|s| s.first_seq).collect::<Vec<_>>(),
            vec![1, 11]
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn damage_loses_only_itself() {
        let d = tmp();
        let p = segment(&d, 1, &[1, 2, 3]);
        let whole = std::fs::read(&p).unwrap();
        let s = scan(&p, 1).unwrap();
        assert_eq!((s.records, s.last_seq, s.stop), (3, Some(3), Stop::End));
        assert_eq!((s.valid_len, s.damaged), (whole.len() as u64, 0));
        let rec = (whole.len() - HEADER_LEN as usize) / 3;

        // Torn: the last record cut anywhere inside.
        for cut in 1..rec {
            std::fs::write(&p, &whole[..whole.len() - cut]).unwrap();
            let s = scan(&p, 1).unwrap();
            assert_eq!((s.records, s.stop), (2, Stop::Truncated), "cut {cut}");
            assert_eq!(s.valid_len, (whole.len() - rec) as u64);
        }
        // A flipped bit anywhere in the second record: the third is still
        // found after it.
        for i in 0..rec {
            let mut b = whole.clone();
            b[HEADER_LEN as usize + rec + i] ^= 0x10;
            std::fs::write(&p, &b).unwrap();
            let s = scan(&p, 1).unwrap();
            assert_eq!(
                (s.records, s.last_seq, s.stop, s.damaged),
                (2, Some(3), Stop::End, rec as u64),
                "bit flip at byte {i} of record 2"
            );
            let mut r = SegmentReader::open(&p, 1).unwrap();
            assert_eq!(r.next(None).unwrap().unwrap().seq, 1);
            assert_eq!(r.next(None).unwrap().unwrap().payload, b"event 3");
        }
        // Zeroes after the records (a file extended but never written).
        let mut b = whole.clone();
        b.extend_from_slice(&[0u8; 64]);
        std::fs::write(&p, &b).unwrap();
        let s = scan(&p, 1).unwrap();
        assert_eq!((s.records, s.stop), (3, Stop::Truncated));
        assert_eq!(s.valid_len, whole.len() as u64);
        // A bad header, or one naming another first number than the name.
        let mut b = whole.clone();
        b[0] = b'X';
        std::fs::write(&p, &b).unwrap();
        assert_eq!(scan(&p, 1).unwrap().valid_len, 0);
        std::fs::write(&p, &whole).unwrap();
        assert_eq!(scan(&p, 2).unwrap().valid_len, 0);
        let e = SegmentReader::open(&p, 2).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // Shorter than a header.
        std::fs::write(&p, &whole[..5]).unwrap();
        assert_eq!(
            SegmentReader::open(&p, 1).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn hostile_numbers_and_lengths_are_damage() {
        // A record numbered u64::MAX (valid CRC): damage, so that `seq + 1`
        // never overflows.
        let mut b = Vec::new();
        encode_record(&mut b, u64::MAX, 1, b"x");
        assert_eq!(decode_record(&b, 0), Err(Stop::Damaged));
        let mut b = Vec::new();
        encode_record(&mut b, MAX_SEQ, 1, b"x");
        assert_eq!(decode_record(&b, 0).unwrap().0.seq, MAX_SEQ);
        // A length far beyond the file, and one beyond the largest payload.
        let mut b = vec![0u8; RECORD_HEADER_LEN];
        b[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_record(&b, 0), Err(Stop::Damaged));
        b[..4].copy_from_slice(&MAX_PAYLOAD.to_le_bytes());
        assert_eq!(decode_record(&b, 0), Err(Stop::Truncated));
        let d = tmp();
        let p = d.join(file_name(1));
        let mut f = header(1).to_vec();
        f.extend_from_slice(&b);
        encode_record(&mut f, 1, 10, b"after");
        std::fs::write(&p, &f).unwrap();
        let s = scan(&p, 1).unwrap();
        assert_eq!((s.records, s.stop), (1, Stop::End), "{s:?}");
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn the_reader_stops_at_the_limit_and_at_damage() {
        let d = tmp();
        let p = segment(&d, 5, &[5, 6, 9]);
        let len = std::fs::metadata(&p).unwrap().len();
        let mut r = SegmentReader::open(&p, 5).unwrap();
        assert_eq!(r.next(None).unwrap().unwrap().seq, 5);
        // A limit inside the second record: not yet.
        assert_eq!(r.next(Some(len - 5)).unwrap().unwrap().seq, 6);
        assert_eq!(r.next(Some(len - 5)).unwrap(), Err(Stop::End));
        let third = r.next(Some(len)).unwrap().unwrap();
        assert_eq!((third.seq, third.time_ns), (9, 90));
        assert_eq!(third.payload, b"event 9");
        assert_eq!(r.next(None).unwrap(), Err(Stop::End));
        assert_eq!(first_time(&p, 5).unwrap(), Some(50));
        assert_eq!(first_time(&p, 4).unwrap(), None, "another segment's name");

        let mut b = std::fs::read(&p).unwrap();
        let n = b.len();
        b[n - 2] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let mut r = SegmentReader::open(&p, 5).unwrap();
        r.next(None).unwrap().unwrap();
        r.next(None).unwrap().unwrap();
        assert_eq!(r.next(None).unwrap(), Err(Stop::Truncated));
        std::fs::remove_dir_all(d).unwrap();
    }

    /// A piece of a segment: a valid record (numbered after the previous
    /// one) or arbitrary bytes.
    #[derive(Debug, Clone)]
    enum Piece {
        Record { gap: u64, payload: Vec<u8> },
        Junk(Vec<u8>),
    }

    fn piece() -> impl Strategy<Value = Piece> {
        prop_oneof![
            (1u64..1000, proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(gap, payload)| Piece::Record { gap, payload }),
            proptest::collection::vec(any::<u8>(), 1..200).prop_map(Piece::Junk),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whatever the bytes after a header: no panic, and the records read
        /// back are exactly the valid ones written, in order (junk never
        /// shows as a record, and never hides a valid record after it).
        #[test]
        fn arbitrary_bytes_never_yield_more_than_the_valid_records(
            first in 1u64..1_000_000,
            pieces in proptest::collection::vec(piece(), 0..20),
            raw in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let d = tmp();
            let p = d.join(file_name(first));
            let mut bytes = header(first).to_vec();
            let mut want = Vec::new();
            let mut seq = first - 1;
            for piece in &pieces {
                match piece {
                    Piece::Record { gap, payload } => {
                        seq += gap;
                        encode_record(&mut bytes, seq, seq, payload);
                        want.push((seq, payload.clone()));
                    }
                    Piece::Junk(j) => bytes.extend_from_slice(j),
                }
            }
            std::fs::write(&p, &bytes).unwrap();
            let mut r = SegmentReader::open(&p, first).unwrap();
            let mut got = Vec::new();
            while let Ok(rec) = r.next(None).unwrap() {
                got.push((rec.seq, rec.payload));
            }
            prop_assert_eq!(&got, &want);
            let s = scan(&p, first).unwrap();
            prop_assert_eq!(s.records, want.len() as u64);
            prop_assert!(s.valid_len <= s.file_len);

            // Bytes with no structure at all, header included.
            std::fs::write(&p, &raw).unwrap();
            let s = scan(&p, first).unwrap();
            prop_assert!(s.valid_len <= s.file_len);
            if let Ok(mut r) = SegmentReader::open(&p, first) {
                while let Ok(rec) = r.next(Some(raw.len() as u64)).unwrap() {
                    prop_assert!(rec.seq <= MAX_SEQ && rec.seq >= first);
                }
            }
            std::fs::remove_dir_all(d).unwrap();
        }
    }
}
