//! The journal's queue: each event encoded once, as a whole record, by the
//! thread that publishes it (the bus hands it over as it numbers it), and
//! taken by the writer thread in batches.
//!
//! 1. The encoded bytes are the event's only encoding: the writer writes
//!    them as they are, readers and the export read them back.
//! 2. Publishing never waits for the writer: what the queue cannot take
//!    (the writer is [`QUEUE_EVENTS`] events or [`QUEUE_BYTES`] behind, a
//!    slow disk) is counted (`lagged`) and is a gap in the numbering.
//! 3. A sleeping writer is woken by an event published alone; the events
//!    of bursts (`EventBus::burst`: the perf drain's passes over its rings,
//!    every millisecond while hits flow) are let gather until
//!    [`WAKE_BYTES`] are queued, the oldest has waited [`MAX_WAIT`], or a
//!    burst adds nothing (the hits stopped): a few wake-ups and `write(2)`s
//!    a second at full hit rate, not one per event or per pass. An event
//!    waits in memory about [`MAX_WAIT`] at most (plus a pass and the write
//!    before it), which is what a crash of the daemon itself can take;
//!    `fdatasync` still follows within `fsync_interval`.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::Encoder;
use super::segment;
use crate::events::{Event, Sink};

/// Events queued for the writer at most (as many as the bus's ring keeps
/// for a subscriber).
pub const QUEUE_EVENTS: usize = crate::events::BUS_CAPACITY;
/// Bytes of records queued for the writer at most.
pub const QUEUE_BYTES: usize = 32 << 20;
/// Bytes of bursts' records queued that wake the writer.
pub const WAKE_BYTES: usize = 256 << 10;
/// Longest time a burst's record waits for the writer while hits flow.
pub const MAX_WAIT: Duration = Duration::from_millis(5);
/// Bytes a batch keeps allocated once written.
const KEEP_BYTES: usize = 1 << 20;

/// Records waiting for the writer (or, on the writer's side, being
/// written).
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Whole records, back to back.
    pub buf: Vec<u8>,
    /// Per record: its sequence number and where it ends in `buf`.
    pub ends: Vec<(u64, usize)>,
    /// Events published that the queue could not take.
    pub lagged: u64,
}

impl Batch {
    /// Empties it, keeping its memory up to what a busy millisecond needs
    /// (a backlog behind a slow disk does not stay allocated).
    pub fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
        self.lagged = 0;
        if self.buf.capacity() > KEEP_BYTES {
            self.buf.shrink_to(KEEP_BYTES);
            self.ends.shrink_to(KEEP_BYTES / 128);
        }
    }
}

struct State {
    queued: Batch,
    /// The writer sleeps until the next event.
    waiting: bool,
    /// When the oldest record queued was (None: none is).
    first_at: Option<Instant>,
    /// The current burst queued a record.
    burst_added: bool,
}

/// The queue between the publishers and the writer.
pub(super) struct Queue {
    encode: Encoder,
    state: Mutex<State>,
    ready: Condvar,
}

impl Queue {
    pub fn new(encode: Encoder) -> Queue {
        Queue {
            encode,
            state: Mutex::new(State {
                queued: Batch {
                    buf: Vec::with_capacity(1 << 20),
                    ends: Vec::with_capacity(4096),
                    lagged: 0,
                },
                waiting: false,
                first_at: None,
                burst_added: false,
            }),
            ready: Condvar::new(),
        }
    }

    /// Swaps what is queued into `into` (which must be empty), first
    /// waiting up to `wait` for an event published alone or the end of a
    /// burst if none is queued.
    pub fn take(&self, into: &mut Batch, wait: Duration) {
        let mut s = self.state.lock().unwrap();
        if s.queued.ends.is_empty() && s.queued.lagged == 0 && !wait.is_zero() {
            s.waiting = true;
            s = self.ready.wait_timeout(s, wait).unwrap().0;
            s.waiting = false;
        }
        s.first_at = None;
        std::mem::swap(&mut s.queued, into);
    }

    /// Wakes the writer if it sleeps (shutdown).
    pub fn wake(&self) {
        let _s = self.state.lock().unwrap();
        self.ready.notify_one();
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        let s = self.state.lock().unwrap();
        s.queued.ends.is_empty() && s.queued.lagged == 0
    }
}

impl State {
    /// Whether the writer is to take what is queued at the end of a burst
    /// (that `added` records or not).
    fn due(&self, added: bool) -> bool {
        !self.queued.ends.is_empty()
            && (!added
                || self.queued.buf.len() >= WAKE_BYTES
                || self.first_at.is_some_and(|t| t.elapsed() >= MAX_WAIT))
    }
}

impl Sink for Queue {
    fn append(&self, ev: &Event, in_burst: bool) {
        let mut s = self.state.lock().unwrap();
        let q = &mut s.queued;
        if q.ends.len() >= QUEUE_EVENTS || q.buf.len() >= QUEUE_BYTES {
            q.lagged += 1;
            return;
        }
        segment::append_record(&mut q.buf, ev.seq, ev.time_ns, |b| (self.encode)(ev, b));
        let end = q.buf.len();
        let first = q.ends.is_empty();
        q.ends.push((ev.seq, end));
        if first {
            s.first_at = Some(Instant::now());
        }
        s.burst_added |= in_burst;
        if s.waiting && !in_burst {
            s.waiting = false;
            self.ready.notify_one();
        }
    }

    fn burst_ended(&self) {
        let mut s = self.state.lock().unwrap();
        let added = std::mem::take(&mut s.burst_added);
        if s.waiting && s.due(added) {
            s.waiting = false;
            self.ready.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::events::EventKind;

    fn exited(seq: u64) -> Event {
        Event {
            seq,
            time_ns: seq * 10,
            owner: None,
            kind: EventKind::ThreadExited { pid: 1, tid: 2 },
            wire: Default::default(),
        }
    }

    #[test]
    fn a_burst_wakes_the_writer_once_enough_is_queued_or_old_or_hits_stopped() {
        let mut s = State {
            queued: Batch::default(),
            waiting: true,
            first_at: None,
            burst_added: false,
        };
        assert!(!s.due(false), "nothing queued");
        s.queued.ends.push((1, 100));
        s.queued.buf.resize(100, 0);
        s.first_at = Some(Instant::now());
        assert!(!s.due(true), "a young, small batch gathers more");
        assert!(s.due(false), "a burst that added nothing: the hits stopped");
        s.queued.buf.resize(WAKE_BYTES, 0);
        assert!(s.due(true), "enough bytes");
        s.queued.buf.truncate(100);
        s.first_at = Instant::now().checked_sub(MAX_WAIT);
        assert!(s.due(true), "old enough");
    }

    #[test]
    fn a_full_queue_counts_what_it_cannot_take_and_takes_again_once_emptied() {
        let q = Queue::new(Arc::new(|e: &Event, b: &mut Vec<u8>| {
            b.extend_from_slice(&e.seq.to_le_bytes())
        }));
        let extra = 3;
        for seq in 1..=(QUEUE_EVENTS + extra) as u64 {
            q.append(&exited(seq), false);
        }
        let mut got = Batch::default();
        q.take(&mut got, Duration::ZERO);
        assert_eq!(got.ends.len(), QUEUE_EVENTS);
        assert_eq!(got.lagged, extra as u64);
        // Whole records, back to back, each ending where it says.
        let mut start = 0;
        for (i, &(seq, end)) in got.ends.iter().enumerate() {
            assert_eq!(seq, i as u64 + 1);
            let mut want = Vec::new();
            segment::encode_record(&mut want, seq, seq * 10, &seq.to_le_bytes());
            assert_eq!(&got.buf[start..end], want.as_slice());
            start = end;
        }
        assert_eq!(start, got.buf.len());
        assert!(q.is_empty());
        got.clear();
        q.append(&exited(70_000), true);
        q.take(&mut got, Duration::ZERO);
        assert_eq!((got.ends.len(), got.lagged), (1, 0));
    }
}
