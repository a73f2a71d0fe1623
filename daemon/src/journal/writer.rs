//! The writer thread: events from the bus appended to segments in batches,
//! synced by group commit, segments rotated and the oldest retired.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use super::segment::{self, SegmentFile};
use super::{Encoder, Journal};
use crate::events::Event;

/// The segment being appended to.
struct Active {
    file: File,
    len: u64,
    records: u64,
    opened: Instant,
}

/// The writer thread's state.
pub(super) struct Writer {
    j: Arc<Journal>,
    rx: broadcast::Receiver<Arc<Event>>,
    encode: Encoder,
    active: Option<Active>,
    unsynced_since: Option<Instant>,
    buf: Vec<u8>,
    payload: Vec<u8>,
    last_written: u64,
}

/// Events or bytes in one write at most.
const BATCH_EVENTS: usize = 4096;
const BATCH_BYTES: usize = 1 << 20;

impl Writer {
    pub(super) fn new(
        j: Arc<Journal>,
        rx: broadcast::Receiver<Arc<Event>>,
        encode: Encoder,
        last_written: u64,
    ) -> Writer {
        Writer {
            j,
            rx,
            encode,
            active: None,
            unsynced_since: None,
            buf: Vec::with_capacity(1 << 20),
            payload: Vec::with_capacity(1024),
            last_written,
        }
    }

    pub(super) fn run(mut self, handle: Option<tokio::runtime::Handle>) {
        let mut batch: Vec<Arc<Event>> = Vec::with_capacity(BATCH_EVENTS);
        // The segment is open from the start (named by the next number: its
        // first record can only be later), so the daemon's files do not
        // change with its first event.
        if let Err(e) = self.open_segment(self.last_written + 1) {
            tracing::error!(error = %e, "journal: cannot open a segment");
        }
        loop {
            let stopping = self.j.stop.load(Ordering::Acquire);
            // Wait for an event, no longer than the next sync or rotation
            // is due (or a short poll of the stop flag).
            let wait = self.next_deadline().min(Duration::from_millis(200));
            let first = if stopping {
                self.try_recv()
            } else {
                match &handle {
                    Some(h) => {
                        h.block_on(async { tokio::time::timeout(wait, self.rx.recv()).await.ok() })
                    }
                    None => {
                        let r = self.try_recv();
                        if r.is_none() {
                            std::thread::sleep(wait.min(Duration::from_millis(2)));
                        }
                        r
                    }
                }
            };
            match first {
                Some(Ok(ev)) => batch.push(ev),
                Some(Err(broadcast::error::RecvError::Lagged(n))) => {
                    self.j.stats.lagged.fetch_add(n, Ordering::Relaxed);
                    tracing::warn!(events = n, "journal: the writer fell behind; events lost");
                }
                Some(Err(broadcast::error::RecvError::Closed)) => {
                    self.finish(&mut batch);
                    return;
                }
                None => {}
            }
            while batch.len() < BATCH_EVENTS && self.buf.len() < BATCH_BYTES {
                match self.try_recv() {
                    Some(Ok(ev)) => batch.push(ev),
                    Some(Err(broadcast::error::RecvError::Lagged(n))) => {
                        self.j.stats.lagged.fetch_add(n, Ordering::Relaxed);
                    }
                    _ => break,
                }
            }
            if let Err(e) = self.write(&mut batch) {
                tracing::error!(error = %e, "journal: write failed; events are not journaled");
                batch.clear();
                self.buf.clear();
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Err(e) = self.housekeeping() {
                tracing::error!(error = %e, "journal: sync or rotation failed");
            }
            // Not paced (as subscribers' streams are): tried, a 1 ms pause
            // between batches saved the publishers their futex wake-ups but
            // cost the writer 1.4x per event (633-666 -> 900-933 ns at
            // 100,000 events/s, `cargo bench --bench journal`): the events
            // it reads a millisecond later are no longer in cache.
            if stopping && batch.is_empty() && self.rx.is_empty() {
                self.finish(&mut batch);
                return;
            }
        }
    }

    fn try_recv(&mut self) -> Option<Result<Arc<Event>, broadcast::error::RecvError>> {
        match self.rx.try_recv() {
            Ok(ev) => Some(Ok(ev)),
            Err(broadcast::error::TryRecvError::Lagged(n)) => {
                Some(Err(broadcast::error::RecvError::Lagged(n)))
            }
            Err(broadcast::error::TryRecvError::Closed) => {
                Some(Err(broadcast::error::RecvError::Closed))
            }
            Err(broadcast::error::TryRecvError::Empty) => None,
        }
    }

    /// Time until a sync or an age rotation is due.
    fn next_deadline(&self) -> Duration {
        let mut d = Duration::from_secs(1);
        if let Some(t) = self.unsynced_since {
            d = d.min(self.j.cfg.fsync_interval.saturating_sub(t.elapsed()));
        }
        if let Some(a) = &self.active
            && a.records > 0
        {
            d = d.min(self.j.cfg.segment_age.saturating_sub(a.opened.elapsed()));
        }
        d.max(Duration::from_millis(1))
    }

    fn finish(&mut self, batch: &mut Vec<Arc<Event>>) {
        if let Err(e) = self.write(batch) {
            tracing::error!(error = %e, "journal: last write failed");
        }
        if let Err(e) = self.sync() {
            tracing::error!(error = %e, "journal: last sync failed");
        }
        let mut w = self.j.written.lock().unwrap();
        w.stopped = true;
        drop(w);
        self.j.progress.send_replace(self.last_written);
    }

    /// Encodes and writes `batch` (one `write` per segment it lands in).
    fn write(&mut self, batch: &mut Vec<Arc<Event>>) -> io::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let first = batch[0].seq;
        if self.active.is_none() {
            self.open_segment(first)?;
        }
        self.buf.clear();
        for ev in batch.iter() {
            self.payload.clear();
            (self.encode)(ev, &mut self.payload);
            let before = self.buf.len();
            segment::encode_record(&mut self.buf, ev.seq, ev.time_ns, &self.payload);
            let a = self.active.as_ref().expect("opened above");
            // Rotation by size: a full segment is written out and closed
            // before this record, which starts the next one.
            if a.records > 0 && a.len + self.buf.len() as u64 > self.j.cfg.segment_bytes {
                let rec = self.buf.split_off(before);
                self.append()?;
                self.rotate(ev.seq)?;
                self.buf = rec;
            }
            self.active.as_mut().expect("open").records += 1;
            self.last_written = ev.seq;
        }
        self.append()?;
        batch.clear();
        Ok(())
    }

    /// Writes `buf` to the active segment and tells readers.
    fn append(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let a = self.active.as_mut().expect("open");
        a.file.write_all(&self.buf)?;
        a.len += self.buf.len() as u64;
        let s = &self.j.stats;
        s.bytes.fetch_add(self.buf.len() as u64, Ordering::Relaxed);
        s.written_bytes
            .fetch_add(self.buf.len() as u64, Ordering::Relaxed);
        s.written_seq.store(self.last_written, Ordering::Relaxed);
        {
            let mut w = self.j.written.lock().unwrap();
            w.tail_len = a.len;
            w.seq = self.last_written;
        }
        self.j.progress.send_replace(self.last_written);
        self.unsynced_since.get_or_insert_with(Instant::now);
        self.buf.clear();
        if !self.j.cfg.write_delay.is_zero() {
            std::thread::sleep(self.j.cfg.write_delay);
        }
        Ok(())
    }

    fn open_segment(&mut self, first_seq: u64) -> io::Result<()> {
        // Append to the newest segment left by the last run, unless it is
        // full.
        let reuse = {
            let w = self.j.written.lock().unwrap();
            w.segments.last().cloned()
        };
        if let Some(s) = reuse {
            let len = std::fs::metadata(&s.path)?.len();
            if len < self.j.cfg.segment_bytes {
                let file = crate::statedir::open(&s.path, OpenOptions::new().append(true))?;
                self.active = Some(Active {
                    file,
                    len,
                    records: u64::from(len > segment::HEADER_LEN),
                    opened: Instant::now(),
                });
                return Ok(());
            }
        }
        self.create_segment(first_seq)
    }

    fn create_segment(&mut self, first_seq: u64) -> io::Result<()> {
        let path = self.j.cfg.dir.join(segment::file_name(first_seq));
        let mut file =
            crate::statedir::open(&path, OpenOptions::new().create_new(true).append(true))?;
        file.write_all(&segment::header(first_seq))?;
        // The new name must survive a crash too.
        File::open(&self.j.cfg.dir)?.sync_all()?;
        self.active = Some(Active {
            file,
            len: segment::HEADER_LEN,
            records: 0,
            opened: Instant::now(),
        });
        let s = &self.j.stats;
        s.bytes.fetch_add(segment::HEADER_LEN, Ordering::Relaxed);
        s.segments.fetch_add(1, Ordering::Relaxed);
        let mut w = self.j.written.lock().unwrap();
        w.segments.push(SegmentFile { first_seq, path });
        w.tail_len = segment::HEADER_LEN;
        Ok(())
    }

    /// Closes the active segment (synced) and starts one at `next_seq`.
    fn rotate(&mut self, next_seq: u64) -> io::Result<()> {
        self.sync()?;
        self.create_segment(next_seq)?;
        self.retain()
    }

    fn sync(&mut self) -> io::Result<()> {
        if self.unsynced_since.is_none() {
            return Ok(());
        }
        if let Some(a) = &self.active {
            let t = Instant::now();
            a.file.sync_data()?;
            let us = t.elapsed().as_micros() as u64;
            let s = &self.j.stats;
            s.fsyncs.fetch_add(1, Ordering::Relaxed);
            s.fsync_us.fetch_add(us, Ordering::Relaxed);
            s.fsync_max_us.fetch_max(us, Ordering::Relaxed);
        }
        self.unsynced_since = None;
        self.j
            .stats
            .durable_seq
            .store(self.last_written, Ordering::Relaxed);
        Ok(())
    }

    /// Syncs when due, rotates an old segment, applies retention.
    fn housekeeping(&mut self) -> io::Result<()> {
        if self
            .unsynced_since
            .is_some_and(|t| t.elapsed() >= self.j.cfg.fsync_interval)
        {
            self.sync()?;
        }
        if let Some(a) = &self.active
            && a.records > 0
            && a.opened.elapsed() >= self.j.cfg.segment_age
        {
            let next = self.last_written + 1;
            self.rotate(next)?;
        }
        Ok(())
    }

    /// Deletes the oldest closed segments while the journal is over its
    /// size, counting their events.
    fn retain(&mut self) -> io::Result<()> {
        loop {
            let victim = {
                let w = self.j.written.lock().unwrap();
                if self.j.stats.bytes.load(Ordering::Relaxed) <= self.j.cfg.max_bytes
                    || w.segments.len() < 2
                {
                    return Ok(());
                }
                (w.segments[0].clone(), w.segments[1].first_seq)
            };
            let (old, next_first) = victim;
            let len = std::fs::metadata(&old.path).map(|m| m.len()).unwrap_or(0);
            match std::fs::remove_file(&old.path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let s = &self.j.stats;
            s.bytes
                .fetch_sub(len.min(s.bytes.load(Ordering::Relaxed)), Ordering::Relaxed);
            s.segments.fetch_sub(1, Ordering::Relaxed);
            s.retired
                .fetch_add(next_first - old.first_seq, Ordering::Relaxed);
            self.j.written.lock().unwrap().segments.remove(0);
            tracing::info!(
                segment = %old.path.display(),
                events = next_first - old.first_seq,
                "journal: oldest segment deleted (retention)"
            );
        }
    }
}
