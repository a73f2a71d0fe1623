//! The durable journal (`wpd --state-dir DIR`): every event the bus
//! publishes, appended by one writer thread to checksummed segment files
//! under `DIR/journal/`, and read back for replays (`StreamEvents` with
//! `after_seq` or `since_time_ns`) and for export.
//!
//! 1. The writer is a subscriber of the bus like any other: publishing
//!    never waits for the disk. Events it falls too far behind to receive
//!    are counted (`lagged`) and show as a gap in the sequence numbers,
//!    which readers report.
//! 2. Each batch of events is one `write(2)`; `fdatasync` runs at most
//!    `fsync_interval` after the first write not yet synced, busy or not
//!    (group commit). Written data survives a crash of the daemon (the page
//!    cache holds it, kernel-facts §9); the interval bounds what a crash of
//!    the machine can take.
//! 3. A segment is closed (synced) when it reaches `segment_bytes` or
//!    `segment_age`; the oldest segments are deleted while the journal is
//!    larger than `max_bytes`, and their events counted (`retired`).
//! 4. At start the newest segment is checked record by record and a torn or
//!    damaged tail is cut off (`torn`); numbering continues after the last
//!    valid event.
//!
//! The payload of a record is opaque here: the RPC layer encodes events
//! (`Encoder`) and decodes them when replaying.

pub mod segment;

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::events::{Event, EventBus};
use segment::{Record, SegmentFile, SegmentReader, Stop};

/// Encodes one event's payload into the buffer.
pub type Encoder = Arc<dyn Fn(&Event, &mut Vec<u8>) + Send + Sync>;

/// Journal settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory of the segments.
    pub dir: PathBuf,
    /// A segment is closed once it holds this many bytes.
    pub segment_bytes: u64,
    /// A segment is closed once it is this old (and holds a record).
    pub segment_age: Duration,
    /// The oldest segments are deleted while all of them hold more.
    pub max_bytes: u64,
    /// Longest time written events wait for `fdatasync`.
    pub fsync_interval: Duration,
    /// Fault injection for the replay tests: the writer waits this long
    /// after every write, as on a slow disk (`WPD_FAULT_JOURNAL_DELAY_MS`).
    pub write_delay: Duration,
}

impl Config {
    /// Defaults for a journal in `dir`.
    pub fn new(dir: PathBuf) -> Self {
        Config {
            dir,
            segment_bytes: 64 << 20,
            segment_age: Duration::from_secs(3600),
            max_bytes: 1 << 30,
            fsync_interval: Duration::from_millis(100),
            write_delay: std::env::var("WPD_FAULT_JOURNAL_DELAY_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(Duration::ZERO, Duration::from_millis),
        }
    }
}

/// The journal's counters (all monotonic but `bytes` and `segments`).
#[derive(Debug, Default)]
pub struct Stats {
    /// Sequence number of the last event written.
    pub written_seq: AtomicU64,
    /// Sequence number of the last event on stable storage.
    pub durable_seq: AtomicU64,
    /// Bytes of all segments.
    pub bytes: AtomicU64,
    /// Segment files.
    pub segments: AtomicU64,
    /// Events the writer never received (it fell behind the bus's ring).
    pub lagged: AtomicU64,
    /// Events deleted by retention.
    pub retired: AtomicU64,
    /// fdatasync calls.
    pub fsyncs: AtomicU64,
    /// Their total time, µs.
    pub fsync_us: AtomicU64,
    /// Longest fdatasync, µs.
    pub fsync_max_us: AtomicU64,
    /// Torn or damaged tails cut off at start.
    pub torn: AtomicU64,
    /// Bytes encoded and written (records, headers included).
    pub written_bytes: AtomicU64,
}

/// A snapshot of [`Stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// See [`Stats::written_seq`].
    pub written_seq: u64,
    /// See [`Stats::durable_seq`].
    pub durable_seq: u64,
    /// See [`Stats::bytes`].
    pub bytes: u64,
    /// See [`Stats::segments`].
    pub segments: u64,
    /// See [`Stats::lagged`].
    pub lagged: u64,
    /// See [`Stats::retired`].
    pub retired: u64,
    /// See [`Stats::fsyncs`].
    pub fsyncs: u64,
    /// See [`Stats::fsync_us`].
    pub fsync_us: u64,
    /// See [`Stats::fsync_max_us`].
    pub fsync_max_us: u64,
    /// See [`Stats::torn`].
    pub torn: u64,
}

/// What the writer publishes for readers: the segments, and how far the
/// newest one is written.
#[derive(Debug, Default)]
struct Written {
    /// Segments on disk, oldest first.
    segments: Vec<SegmentFile>,
    /// Bytes of the newest segment that hold whole records.
    tail_len: u64,
    /// Sequence number of the last event written.
    seq: u64,
    /// The writer has stopped (nothing more will be written).
    stopped: bool,
}

/// The journal: its writer thread and what readers need.
pub struct Journal {
    cfg: Config,
    /// This journal's identity (made when its directory was first used):
    /// with a sequence number, names one event across restarts and hosts.
    id: String,
    stats: Arc<Stats>,
    written: Arc<Mutex<Written>>,
    /// Woken after every write (readers following the tail wait on it).
    progress: tokio::sync::watch::Sender<u64>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.cfg.dir)
            .finish()
    }
}

/// The segment being appended to.
struct Active {
    file: File,
    len: u64,
    records: u64,
    opened: Instant,
}

/// State recovered from disk at start.
#[derive(Debug)]
struct Recovered {
    segments: Vec<SegmentFile>,
    /// Last valid sequence number (0: none ever).
    last_seq: u64,
    /// Bytes of every segment after the cut.
    bytes: u64,
    torn: bool,
}

/// A journal identity: a UUID's characters.
fn is_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// The identity kept in `dir/id`, made (a random UUID) the first time.
fn journal_id(dir: &Path) -> io::Result<String> {
    let path = dir.join("id");
    match crate::statedir::read(&path, 4096) {
        Ok(Some(b)) => match String::from_utf8(b) {
            Ok(s) if is_id(s.trim()) => return Ok(s.trim().to_string()),
            _ => tracing::warn!(
                file = %path.display(),
                "journal: its identity is damaged; it gets a new one (an export starts over)"
            ),
        },
        Ok(None) => {}
        Err(e) => return Err(e),
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/uuid")?
        .trim()
        .to_string();
    crate::statedir::replace(&path, format!("{id}\n").as_bytes())?;
    Ok(id)
}

fn recover(dir: &Path) -> io::Result<Recovered> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(crate::statedir::DIR_MODE)
            .create(dir)?;
    }
    let mut segments = segment::list(dir)?;
    let mut torn = false;
    let mut last_seq = 0;
    // Newest first: the newest segment with a valid record gives the last
    // sequence number; a segment with none is dropped (a crash right after
    // it was created, or one damaged from its first record).
    while let Some(newest) = segments.last() {
        let s = segment::scan(&newest.path)?;
        if s.stop != Stop::End {
            torn = true;
            tracing::warn!(
                segment = %newest.path.display(),
                valid = s.valid_len,
                cut = s.file_len - s.valid_len,
                "journal: a torn or damaged tail was cut off"
            );
        }
        match s.last_seq {
            Some(last) => {
                if s.valid_len < s.file_len {
                    let f = crate::statedir::open(&newest.path, OpenOptions::new().write(true))?;
                    f.set_len(s.valid_len)?;
                    f.sync_all()?;
                }
                last_seq = last;
                break;
            }
            None => {
                last_seq = newest.first_seq.saturating_sub(1);
                std::fs::remove_file(&newest.path)?;
                segments.pop();
            }
        }
    }
    let mut bytes = 0;
    for s in &segments {
        bytes += std::fs::metadata(&s.path)?.len();
    }
    Ok(Recovered {
        segments,
        last_seq,
        bytes,
        torn,
    })
}

impl Journal {
    /// Opens (or creates) the journal in `cfg.dir`, recovers its tail, makes
    /// `bus` number events after the last one on disk, and starts the writer
    /// on the bus. Call before anything publishes.
    pub fn start(cfg: Config, bus: &EventBus, encode: Encoder) -> io::Result<Arc<Journal>> {
        let rec = recover(&cfg.dir)?;
        bus.continue_after(rec.last_seq);
        let rx = bus.journal_receiver();
        let stats = Arc::new(Stats::default());
        stats.written_seq.store(rec.last_seq, Ordering::Relaxed);
        stats.durable_seq.store(rec.last_seq, Ordering::Relaxed);
        stats.bytes.store(rec.bytes, Ordering::Relaxed);
        stats
            .segments
            .store(rec.segments.len() as u64, Ordering::Relaxed);
        stats.torn.store(u64::from(rec.torn), Ordering::Relaxed);
        let tail_len = match rec.segments.last() {
            Some(s) => std::fs::metadata(&s.path)?.len(),
            None => 0,
        };
        let written = Arc::new(Mutex::new(Written {
            segments: rec.segments,
            tail_len,
            seq: rec.last_seq,
            stopped: false,
        }));
        let id = journal_id(&cfg.dir)?;
        let journal = Arc::new(Journal {
            progress: tokio::sync::watch::channel(rec.last_seq).0,
            id,
            cfg,
            stats,
            written,
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        });
        tracing::info!(
            dir = %journal.cfg.dir.display(),
            last_seq = rec.last_seq,
            segments = journal.stats.segments.load(Ordering::Relaxed),
            "journal opened"
        );
        let handle = tokio::runtime::Handle::try_current().ok();
        let writer = Writer {
            j: journal.clone(),
            rx,
            encode,
            active: None,
            unsynced_since: None,
            buf: Vec::with_capacity(1 << 20),
            payload: Vec::with_capacity(1024),
            last_written: rec.last_seq,
        };
        let t = std::thread::Builder::new()
            .name("wpd-journal".into())
            .spawn(move || writer.run(handle))?;
        *journal.thread.lock().unwrap() = Some(t);
        Ok(journal)
    }

    /// Where the segments are.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// This journal's identity (see the field).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The counters now.
    pub fn figures(&self) -> Figures {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Figures {
            written_seq: l(&s.written_seq),
            durable_seq: l(&s.durable_seq),
            bytes: l(&s.bytes),
            segments: l(&s.segments),
            lagged: l(&s.lagged),
            retired: l(&s.retired),
            fsyncs: l(&s.fsyncs),
            fsync_us: l(&s.fsync_us),
            fsync_max_us: l(&s.fsync_max_us),
            torn: l(&s.torn),
        }
    }

    /// Sequence number of the last event written (readable by readers).
    pub fn written_seq(&self) -> u64 {
        self.written.lock().unwrap().seq
    }

    /// Waits until the writer has written every event up to `seq`, or has
    /// stopped. Events it will never write (lagged) count as written once a
    /// later one is.
    pub async fn written_through(&self, seq: u64) {
        let mut rx = self.progress.subscribe();
        loop {
            {
                let w = self.written.lock().unwrap();
                if w.seq >= seq || w.stopped {
                    return;
                }
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// A watch that changes after every write (the last sequence number
    /// written).
    pub fn progress(&self) -> tokio::sync::watch::Receiver<u64> {
        self.progress.subscribe()
    }

    /// Stops the writer after it has written and synced what it received.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }

    /// A reader of the events after `from`.
    pub fn reader(self: &Arc<Self>, from: From) -> Reader {
        Reader {
            j: self.clone(),
            from,
            current: None,
            finished: None,
            pending: None,
            last_seq: None,
        }
    }
}

/// Where a replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
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
    from: From,
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
                    Opened::Gone => continue,
                    Opened::Nothing => break,
                }
            }
            let (first, reader) = self.current.as_mut().expect("opened above");
            let first = *first;
            let newest = segments.last().map(|s| s.first_seq) == Some(first);
            match reader.next(newest.then_some(tail_len))? {
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
                            "journal: damaged record; the rest of the segment is skipped"
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
            (Some(last), _) => holding(last + 1).unwrap_or(0),
            (None, From::AfterSeq(after)) => holding(after + 1).unwrap_or(0),
            (None, From::SinceTime(t)) => {
                let mut pick = 0;
                for (i, s) in segments.iter().enumerate() {
                    if let Ok(Some(first)) = segment::first_time(&s.path)
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
        match SegmentReader::open(&s.path) {
            Ok(r) => {
                self.current = Some((s.first_seq, r));
                Ok(Opened::Yes)
            }
            // Deleted by retention since the listing: list again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Opened::Gone),
            Err(e) => Err(e),
        }
    }

    /// Takes a record read: skipped (before the start or already
    /// returned), or returned, after the gap before it if there is one.
    fn take(&mut self, rec: Record, out: &mut Vec<Item>) {
        let gap_after = match (self.last_seq, self.from) {
            (Some(last), _) if rec.seq <= last => return,
            (Some(last), _) => last,
            (None, From::AfterSeq(after)) if rec.seq <= after => return,
            // From the oldest on disk (0), what retention deleted before it
            // is missing too.
            (None, From::AfterSeq(after)) => after,
            (None, From::SinceTime(t)) if rec.time_ns < t => return,
            (None, From::SinceTime(_)) => rec.seq - 1,
        };
        if rec.seq > gap_after + 1 {
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
}

/// The writer thread's state.
struct Writer {
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
    fn run(mut self, handle: Option<tokio::runtime::Handle>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventKind;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "wpd-journal-{tag}-{}-{}",
            std::process::id(),
            crate::clock::monotonic_ns()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Payload: the thread id of a ThreadExited event, as text.
    fn encoder() -> Encoder {
        Arc::new(|e: &Event, buf: &mut Vec<u8>| {
            if let EventKind::ThreadExited { tid, .. } = e.kind {
                buf.extend_from_slice(tid.to_string().as_bytes());
            }
        })
    }

    fn publish(bus: &EventBus, tids: std::ops::Range<i32>) {
        for tid in tids {
            bus.publish(EventKind::ThreadExited { pid: 1, tid });
        }
    }

    fn cfg(dir: &Path) -> Config {
        let mut c = Config::new(dir.to_path_buf());
        c.fsync_interval = Duration::from_millis(5);
        c
    }

    fn wait_written(j: &Journal, seq: u64) {
        let t = Instant::now();
        while j.written_seq() < seq {
            assert!(t.elapsed() < Duration::from_secs(10), "writer stuck");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Every item from `from`, as (seq or gap) strings.
    fn read_all(j: &Arc<Journal>, from: From) -> Vec<String> {
        let mut r = j.reader(from);
        let mut out = Vec::new();
        loop {
            let b = r.next_batch(7, u64::MAX).unwrap();
            if b.is_empty() {
                return out;
            }
            for i in b {
                out.push(match i {
                    Item::Event(r) => {
                        format!("{}={}", r.seq, String::from_utf8(r.payload).unwrap())
                    }
                    Item::Gap { first, last } => format!("gap {first}-{last}"),
                });
            }
        }
    }

    #[test]
    fn numbering_continues_across_restarts_and_every_event_reads_back() {
        let dir = tmp("restart");
        let bus = EventBus::new(1 << 10);
        let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
        publish(&bus, 0..100);
        wait_written(&j, 100);
        j.shutdown();
        assert_eq!(j.figures().durable_seq, 100, "synced at shutdown");

        let bus = EventBus::new(1 << 10);
        let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
        assert_eq!(bus.head(), 100);
        publish(&bus, 100..150);
        wait_written(&j, 150);
        let all = read_all(&j, From::AfterSeq(0));
        assert_eq!(all.len(), 150);
        for (i, line) in all.iter().enumerate() {
            assert_eq!(line, &format!("{}={}", i + 1, i));
        }
        assert_eq!(
            read_all(&j, From::AfterSeq(148)),
            vec!["149=148", "150=149"]
        );
        assert!(read_all(&j, From::AfterSeq(150)).is_empty());
        j.shutdown();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_torn_tail_is_cut_and_never_read() {
        let dir = tmp("torn");
        let bus = EventBus::new(1 << 10);
        let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
        publish(&bus, 0..10);
        wait_written(&j, 10);
        j.shutdown();
        drop(bus);
        // A crash in the middle of a batch: the last record half written,
        // then garbage after it.
        let seg = segment::list(&dir).unwrap().pop().unwrap().path;
        let mut b = std::fs::read(&seg).unwrap();
        let n = b.len();
        b.truncate(n - 3);
        b.extend_from_slice(b"\x07garbage");
        std::fs::write(&seg, &b).unwrap();

        let bus = EventBus::new(1 << 10);
        let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
        assert_eq!(j.figures().torn, 1);
        assert_eq!(
            bus.head(),
            9,
            "numbering goes on after the last whole event"
        );
        publish(&bus, 100..102);
        wait_written(&j, 11);
        let all = read_all(&j, From::AfterSeq(0));
        let want: Vec<String> = (1..=9)
            .map(|s| format!("{s}={}", s - 1))
            .chain(["10=100".into(), "11=101".into()])
            .collect();
        assert_eq!(all, want);
        j.shutdown();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn retention_deletes_the_oldest_segments_and_readers_see_the_gap() {
        let dir = tmp("retention");
        let bus = EventBus::new(1 << 12);
        let mut c = cfg(&dir);
        c.segment_bytes = 1000;
        c.max_bytes = 3000;
        let j = Journal::start(c, &bus, encoder()).unwrap();
        let mut reader = j.reader(From::AfterSeq(0));
        let first = reader.next_batch(1000, u64::MAX).unwrap();
        assert!(first.is_empty());
        publish(&bus, 0..1000);
        wait_written(&j, 1000);
        let f = j.figures();
        assert!(f.bytes <= 3000 + 1000, "{f:?}");
        assert!(f.retired > 0, "{f:?}");
        let segs = segment::list(&dir).unwrap();
        assert_eq!(segs.len() as u64, f.segments);
        let oldest = segs[0].first_seq;
        assert_eq!(f.retired, oldest - 1, "every deleted event counted");
        let all = read_all(&j, From::AfterSeq(0));
        assert_eq!(all[0], format!("gap 1-{}", oldest - 1));
        assert_eq!(all.len() as u64, 1 + 1000 - (oldest - 1));
        assert_eq!(all.last().unwrap(), "1000=999");
        j.shutdown();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn reading_by_time_and_following_the_writer() {
        let dir = tmp("time");
        let bus = EventBus::new(1 << 10);
        let mut c = cfg(&dir);
        c.segment_bytes = 400;
        let j = Journal::start(c, &bus, encoder()).unwrap();
        publish(&bus, 0..40);
        wait_written(&j, 40);
        std::thread::sleep(Duration::from_millis(5));
        let t = crate::clock::realtime_ns();
        publish(&bus, 40..60);
        wait_written(&j, 60);
        let since = read_all(&j, From::SinceTime(t));
        assert_eq!(since.first().unwrap(), "41=40");
        assert_eq!(since.len(), 20);

        // Following: what is written after a read comes at the next one,
        // and a batch stops at its limit.
        let mut r = j.reader(From::AfterSeq(55));
        let b = r.next_batch(100, 58).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(r.position(), Some(58));
        assert_eq!(r.next_batch(100, u64::MAX).unwrap().len(), 2);
        assert!(r.next_batch(100, u64::MAX).unwrap().is_empty());
        publish(&bus, 60..65);
        wait_written(&j, 65);
        let b = r.next_batch(100, u64::MAX).unwrap();
        assert_eq!(b.len(), 5);
        assert_eq!(
            b[0],
            Item::Event(Record {
                seq: 61,
                time_ns: match &b[0] {
                    Item::Event(r) => r.time_ns,
                    _ => 0,
                },
                payload: b"60".to_vec()
            })
        );
        j.shutdown();
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_busy_bus_is_synced_within_the_interval_and_an_idle_one_too() {
        let dir = tmp("sync");
        let bus = EventBus::new(1 << 12);
        let mut c = cfg(&dir);
        c.fsync_interval = Duration::from_millis(20);
        let j = Journal::start(c, &bus, encoder()).unwrap();
        // Busy: events keep coming for 200 ms.
        let t = Instant::now();
        let mut tid = 0;
        while t.elapsed() < Duration::from_millis(200) {
            publish(&bus, tid..tid + 10);
            tid += 10;
            std::thread::sleep(Duration::from_micros(200));
        }
        let f = j.figures();
        assert!(f.fsyncs >= 2, "synced while busy: {f:?}");
        // Idle: the last events become durable without another event.
        let last = bus.head();
        let t = Instant::now();
        while j.figures().durable_seq < last {
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", j.figures());
            std::thread::sleep(Duration::from_millis(2));
        }
        j.shutdown();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
