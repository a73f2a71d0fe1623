//! Reading the journal back: in order from a starting point, following the
//! writer, gaps reported.

use std::io;
use std::sync::Arc;

use super::Journal;
use super::segment::{self, Record, SegmentFile, SegmentReader, Stop};

/// Where a replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The events whose sequence number is above this.
    AfterSeq(u64),
    /// The events published at or after this time (Unix ns).
    SinceTime(u64),
}

/// What a reader yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// An event.
    Event(Record),
    /// Events `first..=last` that are not on disk (deleted by retention,
    /// never written because the writer fell behind, or in a damaged
    /// stretch of a segment).
    Gap {
        /// First missing sequence number.
        first: u64,
        /// Last missing sequence number.
        last: u64,
    },
}

/// Reads the journal in order from a starting point, following the writer:
/// [`Reader::next_batch`] returns what is written so far and, called again
/// later, what was written since.
pub struct Reader {
    j: Arc<Journal>,
    from: Start,
    /// The segment being read: its first seq and reader.
    current: Option<(u64, SegmentReader)>,
    /// The last segment read to its end (or to damage): never reopened.
    finished: Option<u64>,
    /// A record read beyond the last batch's limit, for the next one.
    pending: Option<Record>,
    /// Sequence number of the last event returned or reported missing
    /// (None before the first).
    last_seq: Option<u64>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("from", &self.from)
            .field("last_seq", &self.last_seq)
            .finish()
    }
}

impl Reader {
    pub(super) fn new(j: Arc<Journal>, from: Start) -> Reader {
        Reader {
            j,
            from,
            current: None,
            finished: None,
            pending: None,
            last_seq: None,
        }
    }

    /// Sequence number of the last event returned or reported missing.
    pub fn position(&self) -> Option<u64> {
        self.last_seq
    }

    /// Up to `max` items in order, none beyond sequence number `until`.
    /// Empty: nothing more is written yet. Blocking (file reads).
    pub fn next_batch(&mut self, max: usize, until: u64) -> io::Result<Vec<Item>> {
        let mut out = Vec::new();
        if let Some(rec) = self.pending.take() {
            if rec.seq > until {
                self.pending = Some(rec);
                return Ok(out);
            }
            self.take(rec, &mut out);
        }
        while out.len() < max {
            let (segments, tail_len) = {
                let w = self.j.written.lock().unwrap();
                (w.segments.clone(), w.tail_len)
            };
            if self.current.is_none() {
                match self.open_next(&segments)? {
                    Opened::Yes => {}
                    Opened::Gone | Opened::Skipped => continue,
                    Opened::Nothing => break,
                }
            }
            let (first, reader) = self.current.as_mut().expect("opened above");
            let first = *first;
            let newest = segments.last().map(|s| s.first_seq) == Some(first);
            // A segment's records end where the next segment's begin (what
            // a damaged or forged older segment holds past that is not
            // read: the newer one's numbering wins).
            let next_first = segments
                .iter()
                .position(|s| s.first_seq == first)
                .and_then(|i| segments.get(i + 1))
                .map_or(u64::MAX, |s| s.first_seq);
            let damaged = reader.damaged();
            let got = reader.next(newest.then_some(tail_len))?;
            if reader.damaged() > damaged {
                tracing::warn!(
                    segment = first,
                    bytes = reader.damaged() - damaged,
                    before_seq = reader.last_seq(),
                    "journal: damaged bytes skipped; reading goes on after them"
                );
            }
            match got {
                Ok(rec) if rec.seq >= next_first => {
                    self.current = None;
                    self.finished = Some(first);
                }
                Ok(rec) if rec.seq > until => {
                    self.pending = Some(rec);
                    break;
                }
                Ok(rec) => self.take(rec, &mut out),
                Err(Stop::End | Stop::Truncated) if newest => break,
                Err(stop) => {
                    if stop != Stop::End {
                        tracing::warn!(
                            segment = first,
                            after = reader.last_seq(),
                            "journal: a damaged tail ends the segment"
                        );
                    }
                    self.current = None;
                    self.finished = Some(first);
                }
            }
        }
        Ok(out)
    }

    /// Opens the segment holding the next event.
    fn open_next(&mut self, segments: &[SegmentFile]) -> io::Result<Opened> {
        let holding = |seq: u64| segments.iter().rposition(|s| s.first_seq <= seq);
        let mut i = match (self.last_seq, self.from) {
            (Some(last), _) => holding(last.saturating_add(1)).unwrap_or(0),
            (None, Start::AfterSeq(after)) => holding(after.saturating_add(1)).unwrap_or(0),
            (None, Start::SinceTime(t)) => {
                let mut pick = 0;
                for (i, s) in segments.iter().enumerate() {
                    if let Ok(Some(first)) = segment::first_time(&s.path, s.first_seq)
                        && first <= t
                    {
                        pick = i;
                    }
                }
                pick
            }
        };
        if let Some(done) = self.finished {
            while i < segments.len() && segments[i].first_seq <= done {
                i += 1;
            }
        }
        let Some(s) = segments.get(i) else {
            return Ok(Opened::Nothing);
        };
        match SegmentReader::open(&s.path, s.first_seq) {
            Ok(r) => {
                self.current = Some((s.first_seq, r));
                Ok(Opened::Yes)
            }
            // Deleted by retention since the listing: list again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Opened::Gone),
            // Not a segment (a wrong header): its events are a gap.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                tracing::warn!(error = %e, "journal: a segment is skipped");
                self.finished = Some(s.first_seq);
                Ok(Opened::Skipped)
            }
            Err(e) => Err(e),
        }
    }

    /// Takes a record read: skipped (before the start or already
    /// returned), or returned, after the gap before it if there is one.
    fn take(&mut self, rec: Record, out: &mut Vec<Item>) {
        let gap_after = match (self.last_seq, self.from) {
            (Some(last), _) if rec.seq <= last => return,
            (Some(last), _) => last,
            (None, Start::AfterSeq(after)) if rec.seq <= after => return,
            // From the oldest on disk (0), what retention deleted before it
            // is missing too.
            (None, Start::AfterSeq(after)) => after,
            (None, Start::SinceTime(t)) if rec.time_ns < t => return,
            (None, Start::SinceTime(_)) => rec.seq - 1,
        };
        if rec.seq > gap_after.saturating_add(1) {
            out.push(Item::Gap {
                first: gap_after + 1,
                last: rec.seq - 1,
            });
        }
        self.last_seq = Some(rec.seq);
        out.push(Item::Event(rec));
    }
}

/// What [`Reader::open_next`] did.
enum Opened {
    /// A segment is open.
    Yes,
    /// The segment vanished (retention): list again.
    Gone,
    /// No segment holds anything after what was read.
    Nothing,
    /// The segment is not readable (a wrong header): the next one.
    Skipped,
}
