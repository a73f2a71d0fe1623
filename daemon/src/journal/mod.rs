//! The durable journal (`wpd --state-dir DIR`): every event the bus
//! publishes, appended by one writer thread to checksummed segment files
//! under `DIR/journal/`, and read back for replays (`StreamEvents` with
//! `after_seq` or `since_time_ns`) and for export.
//!
//! 1. The bus hands every event to the journal's queue as it numbers it,
//!    subscribers or not (`queue.rs`): the publishing thread encodes it
//!    there, once, into a whole record, and never waits for the disk.
//!    Events the queue cannot take while the writer is behind are counted
//!    (`lagged`) and show as a gap in the sequence numbers, which readers
//!    report.
//! 2. Each batch of records is one `write(2)` of the bytes as they were
//!    encoded; `fdatasync` runs at most
//!    `fsync_interval` after the first write not yet synced, busy or not
//!    (group commit). Written data survives a crash of the daemon (the page
//!    cache holds it, kernel-facts §9); the interval bounds what a crash of
//!    the machine can take.
//! 3. A segment is closed (synced) when it reaches `segment_bytes` or
//!    `segment_age`; the oldest segments are deleted while the journal is
//!    larger than `max_bytes`, and their events counted (`retired`).
//! 4. At start the newest segment is checked record by record and a torn or
//!    damaged tail is cut off (`torn`); numbering continues after the last
//!    valid event. Damage before valid records is kept and skipped by
//!    readers (never the records after it); a newest segment without one
//!    valid record is set aside (`.damaged`); a journal numbered past
//!    `recovery::SEQ_LIMIT` is refused. What is read back is hostile
//!    (`segment`'s rules): a segment that is not one is a gap, never an
//!    error that stops a replay.
//! 5. A write that fails (a full disk, an I/O error) loses its events, and
//!    only those: they are counted (`write_lost`, a gap readers report),
//!    logged with the errno, and the segment is cut back to its last whole
//!    record (`ftruncate` to the length written before), so that nothing
//!    unreadable ever sits before good records; if even that fails, the
//!    segment is left as it is and writing goes on in a new one. Every
//!    later batch tries again: once the disk has room the journal goes on
//!    by itself and says so in the log.
//! 6. A failed `fdatasync` is never retried on the same file: Linux may
//!    have dropped the dirty pages and marked them clean, so a later sync
//!    could succeed without writing them. The events written since the
//!    last good sync are recorded as not durable (`unsynced`; they stay
//!    readable while the machine runs), the segment is closed and writing
//!    goes on in a new segment. `durable_seq` never moves at a failure; it
//!    moves past the recorded range with the next successful sync, so every
//!    event up to it is on stable storage or counted (`lagged`,
//!    `write_lost`, `unsynced`).
//!
//! The payload of a record is opaque here: the RPC layer encodes events
//! (`Encoder`) and decodes them when replaying; the export sends the
//! payload as it was written.

mod queue;
mod reader;
mod recovery;
pub mod segment;
mod writer;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::events::{Event, EventBus};
use queue::Queue;
pub use queue::{MAX_WAIT, QUEUE_BYTES, QUEUE_EVENTS, WAKE_BYTES};
pub use reader::{Item, Reader, Start};
use segment::SegmentFile;
use writer::Writer;

/// Appends one event's payload to the buffer (on the publishing thread,
/// with the bus's order lock held: it must not block).
pub type Encoder = Arc<dyn Fn(&Event, &mut Vec<u8>) + Send + Sync>;

/// The encoder the daemon's journal uses: an event as `StreamEvents` sends
/// it, with its location when the symbolizer already knows the hit's
/// address (one cache probe; the journal never waits for symbols), made by
/// the one encoder of events (`wire`).
pub fn encoder() -> Encoder {
    std::sync::Arc::new(crate::wire::encode_event)
}

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
    /// after every write, as on a slow disk (`wpd` takes it from
    /// `WPD_FAULT_JOURNAL_DELAY_MS`).
    pub write_delay: Duration,
    /// Fault injection for the tests of write and sync failures.
    pub faults: Arc<Faults>,
}

/// Failures the tests make the writer meet (none by default).
#[derive(Debug, Default)]
pub struct Faults {
    /// The next this many writes write half their bytes and fail with
    /// `ENOSPC`, as on a full disk.
    pub writes: AtomicU64,
    /// The next this many `fdatasync` calls fail with `EIO`.
    pub syncs: AtomicU64,
}

impl Faults {
    fn take(n: &AtomicU64) -> bool {
        n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1))
            .is_ok()
    }

    /// Whether this write is to fail.
    fn take_write(&self) -> bool {
        Self::take(&self.writes)
    }

    /// Whether this sync is to fail.
    fn take_sync(&self) -> bool {
        Self::take(&self.syncs)
    }
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
            write_delay: Duration::ZERO,
            faults: Arc::default(),
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
    /// Events the queue could not take (the writer fell behind).
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
    /// Events lost to failed writes (a full disk, an I/O error): a gap in
    /// the numbering, as `lagged`.
    pub write_lost: AtomicU64,
    /// Events written whose `fdatasync` failed: readable while the machine
    /// runs, but a crash of the machine may take them.
    pub unsynced: AtomicU64,
    /// Failed writes, syncs and segment creations.
    pub write_errors: AtomicU64,
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
    /// See [`Stats::write_lost`].
    pub write_lost: u64,
    /// See [`Stats::unsynced`].
    pub unsynced: u64,
    /// See [`Stats::write_errors`].
    pub write_errors: u64,
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
    /// Events encoded and waiting for the writer.
    queue: Arc<Queue>,
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

impl Journal {
    /// Opens (or creates) the journal in `cfg.dir`, recovers its tail, makes
    /// `bus` number events after the last one on disk, and starts the writer
    /// on the bus. Call before anything publishes.
    pub fn start(cfg: Config, bus: &EventBus, encode: Encoder) -> io::Result<Arc<Journal>> {
        let rec = recovery::recover(&cfg.dir)?;
        bus.continue_after(rec.last_seq);
        let queue = Arc::new(Queue::new(encode));
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
        let id = recovery::journal_id(&cfg.dir)?;
        let journal = Arc::new(Journal {
            progress: tokio::sync::watch::channel(rec.last_seq).0,
            id,
            cfg,
            stats,
            written,
            queue: queue.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
        });
        tracing::info!(
            dir = %journal.cfg.dir.display(),
            last_seq = rec.last_seq,
            segments = journal.stats.segments.load(Ordering::Relaxed),
            "journal opened"
        );
        let writer = Writer::new(journal.clone(), rec.last_seq);
        let t = std::thread::Builder::new()
            .name("wpd-journal".into())
            .spawn(move || writer.run())?;
        *journal.thread.lock().unwrap() = Some(t);
        if bus.attach(queue).is_err() {
            journal.shutdown();
            return Err(io::Error::other("the event bus already has a journal"));
        }
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
            write_lost: l(&s.write_lost),
            unsynced: l(&s.unsynced),
            write_errors: l(&s.write_errors),
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
        self.queue.wake();
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }

    /// A reader of the events after `from`.
    pub fn reader(self: &Arc<Self>, from: Start) -> Reader {
        Reader::new(self.clone(), from)
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod tests;
