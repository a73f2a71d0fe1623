//! The writer thread: events from the bus appended to segments in batches,
//! synced by group commit, segments rotated and the oldest retired.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Journal;
use super::queue::Batch;
use super::segment::{self, SegmentFile};

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
    active: Option<Active>,
    unsynced_since: Option<Instant>,
    /// The records taken from the queue, being written.
    batch: Batch,
    /// Sequence number of the last event written.
    last_written: u64,
    /// Events written since the last `fdatasync`.
    unsynced_events: u64,
    /// Writing fails since then (None: it works).
    failing: Option<Failing>,
}

/// A stretch of failed writes.
struct Failing {
    since: Instant,
    /// Events lost since.
    lost: u64,
    /// Last logged.
    logged: Instant,
}

impl Writer {
    pub(super) fn new(j: Arc<Journal>, last_written: u64) -> Writer {
        Writer {
            j,
            active: None,
            unsynced_since: None,
            batch: Batch {
                buf: Vec::with_capacity(1 << 20),
                ends: Vec::with_capacity(4096),
                lagged: 0,
            },
            last_written,
            unsynced_events: 0,
            failing: None,
        }
    }

    pub(super) fn run(mut self) {
        // The segment is open from the start (named by the next number: its
        // first record can only be later), so the daemon's files do not
        // change with its first event.
        if let Err(e) = self.open_segment(self.last_written.saturating_add(1)) {
            tracing::error!(
                error = %e,
                errno = e.raw_os_error().unwrap_or(0),
                "journal: cannot open a segment; the first write tries again"
            );
        }
        loop {
            let stopping = self.j.stop.load(Ordering::Acquire);
            // Wait for an event, no longer than the next sync or rotation
            // is due (or a short poll of the stop flag).
            let wait = match stopping {
                true => Duration::ZERO,
                false => self.next_deadline().min(Duration::from_millis(200)),
            };
            self.j.queue.take(&mut self.batch, wait);
            let took = !self.batch.ends.is_empty() || self.batch.lagged > 0;
            if self.batch.lagged > 0 {
                let n = self.batch.lagged;
                self.j.stats.lagged.fetch_add(n, Ordering::Relaxed);
                tracing::warn!(events = n, "journal: the writer fell behind; events lost");
            }
            self.write();
            self.housekeeping();
            if stopping && !took && self.j.queue.is_empty() {
                self.finish();
                return;
            }
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

    fn finish(&mut self) {
        self.write();
        self.sync();
        let mut w = self.j.written.lock().unwrap();
        w.stopped = true;
        drop(w);
        self.j.progress.send_replace(self.last_written);
    }

    /// Writes the batch taken from the queue (one `write` per segment it
    /// lands in), then empties it. Never fails: what cannot be written is
    /// counted (`write_lost`) and logged, and the next batch tries again.
    fn write(&mut self) {
        let batch = std::mem::take(&mut self.batch);
        let ends = &batch.ends;
        let mut i = 0;
        let mut off = 0;
        while i < ends.len() {
            if self.active.is_none()
                && let Err(e) = self.create_segment(ends[i].0)
            {
                self.lose(&ends[i..], "creating a segment", &e);
                break;
            }
            let (len, records) = {
                let a = self.active.as_ref().expect("opened above");
                (a.len, a.records)
            };
            let start = i;
            while i < ends.len() {
                // Rotation by size: a full segment is written out and
                // closed before this record, which starts the next one.
                if records + (i - start) as u64 > 0
                    && len + (ends[i].1 - off) as u64 > self.j.cfg.segment_bytes
                {
                    break;
                }
                i += 1;
            }
            if i > start {
                let end = ends[i - 1].1;
                if let Err(e) = self.append(&batch.buf[off..end], &ends[start..i]) {
                    self.lose(&ends[start..], "writing", &e);
                    break;
                }
                off = end;
            }
            if i < ends.len() {
                self.rotate(ends[i].0);
            }
        }
        self.batch = batch;
        self.batch.clear();
    }

    /// Writes `buf` (the records of `events`: sequence number, end) to the
    /// active segment and tells readers. On an error the segment is cut
    /// back to its last whole record (or, if that fails too, closed: the
    /// next write starts a new segment), so that nothing after a failed
    /// write is ever unreadable.
    fn append(&mut self, buf: &[u8], events: &[(u64, usize)]) -> io::Result<()> {
        let a = self.active.as_mut().expect("open");
        let fault = self.j.cfg.faults.take_write();
        let r = match fault {
            // As a full disk does: part of the bytes written, then ENOSPC.
            true => a
                .file
                .write_all(&buf[..buf.len() / 2])
                .and(Err(io::Error::from_raw_os_error(libc::ENOSPC))),
            false => a.file.write_all(buf),
        };
        if let Err(e) = r {
            if let Err(cut) = a.file.set_len(a.len) {
                tracing::error!(
                    error = %cut,
                    errno = cut.raw_os_error().unwrap_or(0),
                    "journal: a failed write cannot be cut back; the segment is closed"
                );
                // What it holds before the damage is synced (or counted)
                // before it is left.
                self.sync();
                self.abandon();
            }
            return Err(e);
        }
        let last = events.last().map_or(self.last_written, |e| e.0);
        a.len += buf.len() as u64;
        a.records += events.len() as u64;
        self.unsynced_events += events.len() as u64;
        self.last_written = last;
        let s = &self.j.stats;
        s.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
        s.written_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        s.written_seq.store(last, Ordering::Relaxed);
        {
            let mut w = self.j.written.lock().unwrap();
            w.tail_len = a.len;
            w.seq = w.seq.max(last);
        }
        self.j.progress.send_replace(last);
        self.unsynced_since.get_or_insert_with(Instant::now);
        if let Some(f) = self.failing.take() {
            tracing::info!(
                after = ?f.since.elapsed(),
                events_lost = f.lost,
                "journal: writing works again; the events lost meanwhile are a gap"
            );
        }
        if !self.j.cfg.write_delay.is_zero() {
            std::thread::sleep(self.j.cfg.write_delay);
        }
        Ok(())
    }

    /// Counts `events` as lost to a failed `what`, logs it (the first
    /// failure, then every few seconds while it lasts), and lets readers
    /// waiting for them go on: they will never be written.
    fn lose(&mut self, events: &[(u64, usize)], what: &str, e: &io::Error) {
        let n = events.len() as u64;
        let s = &self.j.stats;
        s.write_lost.fetch_add(n, Ordering::Relaxed);
        s.write_errors.fetch_add(1, Ordering::Relaxed);
        let errno = e.raw_os_error().unwrap_or(0);
        match &mut self.failing {
            None => {
                tracing::error!(
                    error = %e,
                    errno,
                    events = n,
                    "journal: {what} failed; events are counted lost (journal_write_lost) until a \
                     write succeeds"
                );
                self.failing = Some(Failing {
                    since: Instant::now(),
                    lost: n,
                    logged: Instant::now(),
                });
            }
            Some(f) => {
                f.lost += n;
                if f.logged.elapsed() >= Duration::from_secs(10) {
                    f.logged = Instant::now();
                    tracing::error!(
                        error = %e,
                        errno,
                        events_lost = f.lost,
                        since = ?f.since.elapsed(),
                        "journal: {what} still fails"
                    );
                }
            }
        }
        if let Some(last) = events.last().map(|e| e.0) {
            let mut w = self.j.written.lock().unwrap();
            w.seq = w.seq.max(last);
            drop(w);
            self.j.progress.send_replace(last);
        }
    }

    /// Opens the newest segment left by the last run to append to, unless
    /// it is full (at start only: later segments are always new).
    fn open_segment(&mut self, first_seq: u64) -> io::Result<()> {
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
        let made = (|| {
            let mut file =
                crate::statedir::open(&path, OpenOptions::new().create_new(true).append(true))?;
            if self.j.cfg.faults.take_write() {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            file.write_all(&segment::header(first_seq))?;
            // The new name must survive a crash too.
            File::open(&self.j.cfg.dir)?.sync_all()?;
            Ok(file)
        })();
        let file = match made {
            Ok(f) => f,
            Err(e) => {
                // Not left half made (a header cut short by a full disk).
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
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

    /// Stops writing to the active segment (it stays, readable as it is);
    /// one without a record is deleted, so that the next one may take its
    /// name.
    fn abandon(&mut self) {
        let Some(a) = self.active.take() else {
            return;
        };
        if a.records == 0 {
            let mut w = self.j.written.lock().unwrap();
            if let Some(s) = w.segments.pop() {
                if std::fs::remove_file(&s.path).is_ok() {
                    let st = &self.j.stats;
                    st.segments.fetch_sub(1, Ordering::Relaxed);
                    st.bytes.fetch_sub(
                        a.len.min(st.bytes.load(Ordering::Relaxed)),
                        Ordering::Relaxed,
                    );
                } else {
                    w.segments.push(s);
                }
            }
        }
    }

    /// Closes the active segment (synced) and starts one at `next_seq`;
    /// applies retention. If the new segment cannot be made, the next
    /// write tries again.
    fn rotate(&mut self, next_seq: u64) {
        self.sync();
        self.active = None;
        if let Err(e) = self.create_segment(next_seq) {
            tracing::error!(
                error = %e,
                errno = e.raw_os_error().unwrap_or(0),
                "journal: cannot start a new segment; the next write tries again"
            );
            self.j.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Err(e) = self.retain() {
            tracing::error!(error = %e, "journal: retention failed");
        }
    }

    /// `fdatasync` of what was written since the last one. After a failure
    /// the segment is never synced again (the kernel may have dropped the
    /// pages and marked them clean: a later sync could succeed without
    /// writing them): its unsynced events are counted (`unsynced`), it is
    /// closed, and writing goes on in a new segment.
    fn sync(&mut self) {
        if self.unsynced_since.is_none() {
            return;
        }
        let Some(a) = &self.active else {
            self.unsynced_since = None;
            return;
        };
        let t = Instant::now();
        let r = match self.j.cfg.faults.take_sync() {
            true => Err(io::Error::from_raw_os_error(libc::EIO)),
            false => a.file.sync_data(),
        };
        let us = t.elapsed().as_micros() as u64;
        let s = &self.j.stats;
        s.fsyncs.fetch_add(1, Ordering::Relaxed);
        s.fsync_us.fetch_add(us, Ordering::Relaxed);
        s.fsync_max_us.fetch_max(us, Ordering::Relaxed);
        match r {
            Ok(()) => s.durable_seq.store(self.last_written, Ordering::Relaxed),
            Err(e) => {
                s.unsynced
                    .fetch_add(self.unsynced_events, Ordering::Relaxed);
                s.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    error = %e,
                    errno = e.raw_os_error().unwrap_or(0),
                    events = self.unsynced_events,
                    after_seq = s.durable_seq.load(Ordering::Relaxed),
                    through_seq = self.last_written,
                    "journal: fdatasync failed; the events written since the last sync are not \
                     durable (journal_unsynced): a crash of the machine may take them. The \
                     segment is closed and writing goes on in a new one"
                );
                self.abandon();
                // Counted: durable_seq may move past them with the next
                // successful sync.
            }
        }
        self.unsynced_since = None;
        self.unsynced_events = 0;
    }

    /// Syncs when due, rotates an old segment.
    fn housekeeping(&mut self) {
        if self
            .unsynced_since
            .is_some_and(|t| t.elapsed() >= self.j.cfg.fsync_interval)
        {
            self.sync();
        }
        if let Some(a) = &self.active
            && a.records > 0
            && a.opened.elapsed() >= self.j.cfg.segment_age
        {
            let next = self.last_written.saturating_add(1);
            self.rotate(next);
        }
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
                .fetch_add(next_first.saturating_sub(old.first_seq), Ordering::Relaxed);
            self.j.written.lock().unwrap().segments.remove(0);
            tracing::info!(
                segment = %old.path.display(),
                events = next_first.saturating_sub(old.first_seq),
                "journal: oldest segment deleted (retention)"
            );
        }
    }
}
