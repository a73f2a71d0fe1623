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
//! A record is valid when its bytes are all there, its CRC matches and its
//! sequence number is above the previous record's. A torn write (a crash in
//! the middle of a batch) leaves an incomplete or mismatching record at the
//! tail of the newest segment: [`scan`] finds where the valid prefix ends and
//! the writer cuts the rest off before appending.

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
    let len = u32::try_from(payload.len()).expect("an event is far below 4 GiB");
    let mut crc = crc32fast::Hasher::new();
    crc.update(&seq.to_le_bytes());
    crc.update(&time_ns.to_le_bytes());
    crc.update(payload);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(&time_ns.to_le_bytes());
    buf.extend_from_slice(payload);
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
    stem.parse().ok()
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
/// left alone.
pub fn list(dir: &Path) -> io::Result<Vec<SegmentFile>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(first_seq) = name.to_str().and_then(parse_name) {
            out.push(SegmentFile {
                first_seq,
                path: entry.path(),
            });
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
    if seq <= after {
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
    /// Bytes of the valid prefix (header included).
    pub valid_len: u64,
    /// The file's length.
    pub file_len: u64,
    /// Records in the valid prefix.
    pub records: u64,
    /// Sequence number of the last valid record (None: no record).
    pub last_seq: Option<u64>,
    /// Why the valid prefix ends (End: it is the whole file).
    pub stop: Stop,
}

/// Reads a whole segment and finds its valid prefix. A file whose header is
/// missing or wrong has a valid prefix of 0 bytes.
pub fn scan(path: &Path) -> io::Result<Scan> {
    let bytes = std::fs::read(path)?;
    let file_len = bytes.len() as u64;
    if bytes.len() < HEADER_LEN as usize || &bytes[..8] != MAGIC {
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
        });
    }
    let first = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    let mut at = HEADER_LEN as usize;
    let mut last = first.saturating_sub(1);
    let mut records = 0;
    let stop = loop {
        match decode_record(&bytes[at..], last) {
            Ok((r, n)) => {
                at += n;
                last = r.seq;
                records += 1;
            }
            Err(stop) => break stop,
        }
    };
    Ok(Scan {
        valid_len: at as u64,
        file_len,
        records,
        last_seq: (records > 0).then_some(last),
        stop,
    })
}

/// The time of a segment's first record, if it has a valid one.
pub fn first_time(path: &Path) -> io::Result<Option<u64>> {
    let f = crate::statedir::open(path, std::fs::OpenOptions::new().read(true))?;
    let mut head = [0u8; HEADER_LEN as usize + RECORD_HEADER_LEN];
    match f.read_exact_at(&mut head, 0) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    if &head[..8] != MAGIC {
        return Ok(None);
    }
    let h = HEADER_LEN as usize;
    Ok(Some(u64::from_le_bytes(
        head[h + 16..h + 24].try_into().unwrap(),
    )))
}

/// Reads records of one segment sequentially, up to a limit of bytes the
/// writer has finished writing (so a batch being written is never seen
/// half-way).
#[derive(Debug)]
pub struct SegmentReader {
    file: File,
    /// Offset of the next record.
    at: u64,
    /// Bytes read ahead and not yet decoded.
    buf: Vec<u8>,
    /// Offset of `buf[0]`.
    buf_at: u64,
    /// Sequence number of the last record returned.
    last: u64,
}

impl SegmentReader {
    /// Opens `path`, checking its header.
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut file = crate::statedir::open(path, std::fs::OpenOptions::new().read(true))?;
        let mut h = [0u8; HEADER_LEN as usize];
        file.read_exact(&mut h)?;
        if &h[..8] != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is not a journal segment", path.display()),
            ));
        }
        let first = u64::from_le_bytes(h[8..].try_into().unwrap());
        file.seek(SeekFrom::Start(HEADER_LEN))?;
        Ok(SegmentReader {
            file,
            at: HEADER_LEN,
            buf: Vec::new(),
            buf_at: HEADER_LEN,
            last: first.saturating_sub(1),
        })
    }

    /// The next record among the first `limit` bytes of the file (None for
    /// no limit), or why there is none.
    pub fn next(&mut self, limit: Option<u64>) -> io::Result<Result<Record, Stop>> {
        loop {
            let start = (self.at - self.buf_at) as usize;
            match decode_record(&self.buf[start..], self.last) {
                Ok((r, n)) => {
                    if limit.is_some_and(|l| self.at + n as u64 > l) {
                        return Ok(Err(Stop::End));
                    }
                    self.at += n as u64;
                    self.last = r.seq;
                    return Ok(Ok(r));
                }
                Err(Stop::Damaged) => return Ok(Err(Stop::Damaged)),
                Err(Stop::End | Stop::Truncated) => {
                    // Refill: keep the undecoded tail, read more after it.
                    self.buf.drain(..start);
                    self.buf_at = self.at;
                    let end = self.buf_at + self.buf.len() as u64;
                    let want = match limit {
                        Some(l) if l <= end => 0,
                        Some(l) => (l - end).min(1 << 20) as usize,
                        None => 1 << 20,
                    };
                    if want == 0 {
                        return Ok(Err(if self.buf.is_empty() {
                            Stop::End
                        } else {
                            Stop::Truncated
                        }));
                    }
                    let old = self.buf.len();
                    self.buf.resize(old + want, 0);
                    let n = self.file.read_at(&mut self.buf[old..], end)?;
                    self.buf.truncate(old + n);
                    if n == 0 {
                        return Ok(Err(if self.buf.is_empty() {
                            Stop::End
                        } else {
                            Stop::Truncated
                        }));
                    }
                }
            }
        }
    }

    /// Sequence number of the last record returned.
    pub fn last_seq(&self) -> u64 {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let d = tmp();
        segment(&d, 11, &[11, 12]);
        segment(&d, 1, &[1, 2, 3]);
        std::fs::write(d.join("notes.txt"), "x").unwrap();
        let l = list(&d).unwrap();
        assert_eq!(
            l.iter().map(|s| s.first_seq).collect::<Vec<_>>(),
            vec![1, 11]
        );
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn every_kind_of_damage_ends_the_valid_prefix() {
        let d = tmp();
        let p = segment(&d, 1, &[1, 2, 3]);
        let whole = std::fs::read(&p).unwrap();
        let s = scan(&p).unwrap();
        assert_eq!((s.records, s.last_seq, s.stop), (3, Some(3), Stop::End));
        assert_eq!(s.valid_len, whole.len() as u64);
        let rec = (whole.len() - HEADER_LEN as usize) / 3;

        // Torn: the last record cut anywhere inside.
        for cut in 1..rec {
            std::fs::write(&p, &whole[..whole.len() - cut]).unwrap();
            let s = scan(&p).unwrap();
            assert_eq!((s.records, s.stop), (2, Stop::Truncated), "cut {cut}");
            assert_eq!(s.valid_len, (whole.len() - rec) as u64);
        }
        // A flipped bit anywhere in the second record.
        for i in 0..rec {
            let mut b = whole.clone();
            b[HEADER_LEN as usize + rec + i] ^= 0x10;
            std::fs::write(&p, &b).unwrap();
            let s = scan(&p).unwrap();
            assert_eq!(s.records, 1, "bit flip at byte {i} of record 2");
            assert_ne!(s.stop, Stop::End);
        }
        // Zeroes after the records (a file extended but never written).
        let mut b = whole.clone();
        b.extend_from_slice(&[0u8; 64]);
        std::fs::write(&p, &b).unwrap();
        let s = scan(&p).unwrap();
        assert_eq!((s.records, s.stop), (3, Stop::Damaged));
        // A bad header.
        let mut b = whole.clone();
        b[0] = b'X';
        std::fs::write(&p, &b).unwrap();
        assert_eq!(scan(&p).unwrap().valid_len, 0);
        std::fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn the_reader_stops_at_the_limit_and_at_damage() {
        let d = tmp();
        let p = segment(&d, 5, &[5, 6, 9]);
        let len = std::fs::metadata(&p).unwrap().len();
        let mut r = SegmentReader::open(&p).unwrap();
        assert_eq!(r.next(None).unwrap().unwrap().seq, 5);
        // A limit inside the second record: not yet.
        assert_eq!(r.next(Some(len - 5)).unwrap().unwrap().seq, 6);
        assert_eq!(r.next(Some(len - 5)).unwrap(), Err(Stop::End));
        let third = r.next(Some(len)).unwrap().unwrap();
        assert_eq!((third.seq, third.time_ns), (9, 90));
        assert_eq!(third.payload, b"event 9");
        assert_eq!(r.next(None).unwrap(), Err(Stop::End));
        assert_eq!(first_time(&p).unwrap(), Some(50));

        let mut b = std::fs::read(&p).unwrap();
        let n = b.len();
        b[n - 2] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let mut r = SegmentReader::open(&p).unwrap();
        r.next(None).unwrap().unwrap();
        r.next(None).unwrap().unwrap();
        assert_eq!(r.next(None).unwrap(), Err(Stop::Damaged));
        std::fs::remove_dir_all(d).unwrap();
    }
}
