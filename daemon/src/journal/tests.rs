//! The journal end to end in one process: restarts, torn tails, retention,
//! reading by time, group commit.

use super::*;
use crate::events::EventKind;
use crate::journal::segment::Record;
use std::time::Instant;

pub(super) fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "wpd-journal-{tag}-{}-{}",
        std::process::id(),
        crate::clock::monotonic_ns()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Payload: the thread id of a ThreadExited event, as text.
pub(super) fn encoder() -> Encoder {
    Arc::new(|e: &Event, buf: &mut Vec<u8>| {
        if let EventKind::ThreadExited { tid, .. } = e.kind {
            buf.extend_from_slice(tid.to_string().as_bytes());
        }
    })
}

pub(super) fn publish(bus: &EventBus, tids: std::ops::Range<i32>) {
    for tid in tids {
        bus.publish(EventKind::ThreadExited { pid: 1, tid });
    }
}

pub(super) fn cfg(dir: &Path) -> Config {
    let mut c = Config::new(dir.to_path_buf());
    c.fsync_interval = Duration::from_millis(5);
    c
}

pub(super) fn wait_written(j: &Journal, seq: u64) {
    let t = Instant::now();
    while j.written_seq() < seq {
        assert!(t.elapsed() < Duration::from_secs(10), "writer stuck");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every item from `from`, as (seq or gap) strings.
fn read_all(j: &Arc<Journal>, from: Start) -> Vec<String> {
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
    let all = read_all(&j, Start::AfterSeq(0));
    assert_eq!(all.len(), 150);
    for (i, line) in all.iter().enumerate() {
        assert_eq!(line, &format!("{}={}", i + 1, i));
    }
    assert_eq!(
        read_all(&j, Start::AfterSeq(148)),
        vec!["149=148", "150=149"]
    );
    assert!(read_all(&j, Start::AfterSeq(150)).is_empty());
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
    let all = read_all(&j, Start::AfterSeq(0));
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
    let mut reader = j.reader(Start::AfterSeq(0));
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
    let all = read_all(&j, Start::AfterSeq(0));
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
    let since = read_all(&j, Start::SinceTime(t));
    assert_eq!(since.first().unwrap(), "41=40");
    assert_eq!(since.len(), 20);

    // Following: what is written after a read comes at the next one,
    // and a batch stops at its limit.
    let mut r = j.reader(Start::AfterSeq(55));
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

/// Every item of the journal as (events, gaps), and checks that they cover
/// 1..=last once each, in order.
fn events_and_gaps(j: &Arc<Journal>, last: u64) -> (Vec<u64>, Vec<(u64, u64)>) {
    let mut r = j.reader(Start::AfterSeq(0));
    let (mut events, mut gaps) = (Vec::new(), Vec::new());
    let mut next = 1;
    loop {
        let b = r.next_batch(100, u64::MAX).unwrap();
        if b.is_empty() {
            break;
        }
        for i in b {
            match i {
                Item::Event(rec) => {
                    assert_eq!(rec.seq, next, "in order, each once");
                    assert_eq!(
                        String::from_utf8(rec.payload).unwrap(),
                        (rec.seq - 1).to_string()
                    );
                    events.push(rec.seq);
                    next = rec.seq + 1;
                }
                Item::Gap { first, last } => {
                    assert_eq!(first, next, "a gap where the next event is due");
                    gaps.push((first, last));
                    next = last + 1;
                }
            }
        }
    }
    assert_eq!(next, last + 1, "read through {last}");
    (events, gaps)
}

fn gap_total(gaps: &[(u64, u64)]) -> u64 {
    gaps.iter().map(|(a, b)| b - a + 1).sum()
}

/// Publishes `tids` one at a time, each written before the next.
fn publish_each(bus: &EventBus, j: &Journal, tids: std::ops::Range<i32>) {
    for tid in tids {
        publish(bus, tid..tid + 1);
        wait_written(j, bus.head());
    }
}

#[test]
fn a_failed_write_is_counted_cut_back_and_what_follows_reads_back() {
    let dir = tmp("write-fault");
    let bus = EventBus::new(1 << 10);
    let c = cfg(&dir);
    let faults = c.faults.clone();
    let j = Journal::start(c, &bus, encoder()).unwrap();
    publish_each(&bus, &j, 0..10);
    // The next write puts half its bytes on disk and fails (ENOSPC).
    faults.writes.store(1, Ordering::Relaxed);
    publish_each(&bus, &j, 10..11);
    publish_each(&bus, &j, 11..20);
    let f = j.figures();
    assert_eq!((f.write_lost, f.write_errors), (1, 1), "{f:?}");
    assert_eq!(f.written_seq, 20);
    let (events, gaps) = events_and_gaps(&j, 20);
    assert_eq!(gaps, vec![(11, 11)], "the lost event, nothing else");
    assert_eq!(events.len(), 19);
    // No garbage left in the segment: a scan finds every record.
    j.shutdown();
    let seg = segment::list(&dir).unwrap().pop().unwrap();
    let s = segment::scan(&seg.path, seg.first_seq).unwrap();
    assert_eq!((s.records, s.stop), (19, segment::Stop::End), "{s:?}");
    assert_eq!(j.figures().durable_seq, 20);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_failed_segment_creation_loses_only_its_batch_and_the_next_write_retries() {
    let dir = tmp("create-fault");
    let bus = EventBus::new(1 << 10);
    let mut c = cfg(&dir);
    c.segment_bytes = 200;
    let faults = c.faults.clone();
    let j = Journal::start(c, &bus, encoder()).unwrap();
    publish_each(&bus, &j, 0..3);
    // Rotation: the new segment cannot be made, then its first write fails
    // too; the third try works.
    faults.writes.store(2, Ordering::Relaxed);
    publish_each(&bus, &j, 3..40);
    let f = j.figures();
    assert!(f.write_lost >= 1 && f.write_errors >= 2, "{f:?}");
    let (events, gaps) = events_and_gaps(&j, 40);
    assert_eq!(gap_total(&gaps), f.write_lost, "{gaps:?}");
    assert_eq!(events.len() as u64, 40 - f.write_lost);
    j.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn after_a_failed_sync_nothing_unsynced_counts_as_durable() {
    let dir = tmp("sync-fault");
    let bus = EventBus::new(1 << 10);
    let mut c = cfg(&dir);
    c.fsync_interval = Duration::from_millis(1);
    let faults = c.faults.clone();
    let j = Journal::start(c, &bus, encoder()).unwrap();
    publish_each(&bus, &j, 0..5);
    let t = Instant::now();
    while j.figures().durable_seq < 5 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", j.figures());
        std::thread::sleep(Duration::from_millis(1));
    }
    let segments_before = j.figures().segments;
    faults.syncs.store(1, Ordering::Relaxed);
    publish_each(&bus, &j, 5..8);
    let t = Instant::now();
    while j.figures().write_errors == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", j.figures());
        std::thread::sleep(Duration::from_millis(1));
    }
    let f = j.figures();
    // Events 6..=8 are written in one or more batches as the writer takes
    // them (one at a time on a busy machine): those of the failing sync,
    // 1 to 3, are counted as not durable; a later batch's successful sync
    // then moves the durable position past them, as promised (every event
    // up to it on stable storage or counted unsynced).
    assert!((1..=3).contains(&f.unsynced), "{f:?}");
    assert!(f.durable_seq <= 8, "{f:?}");
    // Writing goes on in a new segment, which syncs.
    publish_each(&bus, &j, 8..12);
    let t = Instant::now();
    while j.figures().durable_seq < 12 {
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", j.figures());
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(j.figures().segments, segments_before + 1);
    // Nothing lost to readers: every event is still there.
    let (events, gaps) = events_and_gaps(&j, 12);
    assert!(gaps.is_empty(), "{gaps:?}");
    assert_eq!(events.len(), 12);
    j.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Writes a segment of `seqs` (payload: seq - 1, as the journal's
/// encoder would) into `dir`.
fn forge_segment(dir: &Path, first: u64, seqs: &[u64]) -> PathBuf {
    let mut b = segment::header(first).to_vec();
    for &s in seqs {
        segment::encode_record(&mut b, s, s, (s - 1).to_string().as_bytes());
    }
    let p = dir.join(segment::file_name(first));
    std::fs::write(&p, &b).unwrap();
    p
}

#[test]
fn damage_in_the_middle_of_the_newest_segment_keeps_the_records_after_it() {
    let dir = tmp("mid-damage");
    let p = forge_segment(&dir, 1, &[1, 2, 3, 4, 5]);
    let mut b = std::fs::read(&p).unwrap();
    // Record 2's checksum broken; garbage at the tail.
    b[segment::HEADER_LEN as usize + 26 + 5] ^= 0xff;
    b.extend_from_slice(b"\x03\x00\x00\x00torn");
    std::fs::write(&p, &b).unwrap();
    let bus = EventBus::new(1 << 10);
    let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
    assert_eq!(j.figures().torn, 1);
    assert_eq!(bus.head(), 5, "numbering after the last good record");
    publish(&bus, 5..7);
    wait_written(&j, 7);
    assert_eq!(
        read_all(&j, Start::AfterSeq(0)),
        vec!["1=0", "gap 2-2", "3=2", "4=3", "5=4", "6=5", "7=6"]
    );
    j.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_segment_that_is_not_one_is_skipped_or_set_aside_never_fatal() {
    let dir = tmp("bad-segments");
    forge_segment(&dir, 1, &[1, 2]);
    // A middle segment whose header names another number, one whose
    // header is garbage, and a newest one that is all garbage.
    let p = forge_segment(&dir, 3, &[3, 4]);
    let mut b = std::fs::read(&p).unwrap();
    b[8] = 9;
    std::fs::write(&p, &b).unwrap();
    std::fs::write(dir.join(segment::file_name(5)), b"garbage, not a segment").unwrap();
    forge_segment(&dir, 7, &[7, 8]);
    let junk = dir.join(segment::file_name(9));
    std::fs::write(&junk, [0xabu8; 300]).unwrap();
    let bus = EventBus::new(1 << 10);
    let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
    assert!(!junk.exists(), "set aside");
    assert!(
        dir.join(format!("{}.damaged", segment::file_name(9)))
            .exists()
    );
    assert_eq!(bus.head(), 8);
    assert_eq!(
        read_all(&j, Start::AfterSeq(0)),
        vec!["1=0", "2=1", "gap 3-6", "7=6", "8=7"]
    );
    // Hostile starting points from a client: no overflow, nothing read.
    assert!(read_all(&j, Start::AfterSeq(u64::MAX)).is_empty());
    assert!(read_all(&j, Start::AfterSeq(u64::MAX - 1)).is_empty());
    assert!(read_all(&j, Start::SinceTime(u64::MAX)).is_empty());
    j.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn an_older_segment_never_reads_past_where_the_next_begins() {
    let dir = tmp("overlap");
    // A forged older segment holding numbers of the newer one.
    forge_segment(&dir, 1, &[1, 2, 3, 10, 11]);
    forge_segment(&dir, 4, &[4, 5]);
    let bus = EventBus::new(1 << 10);
    let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
    assert_eq!(bus.head(), 5, "numbered after the newest segment");
    publish(&bus, 5..7);
    wait_written(&j, 7);
    assert_eq!(
        read_all(&j, Start::AfterSeq(0)),
        vec!["1=0", "2=1", "3=2", "4=3", "5=4", "6=5", "7=6"]
    );
    j.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_journal_numbered_near_the_end_of_the_range_is_refused() {
    let dir = tmp("seq-limit");
    forge_segment(&dir, segment::MAX_SEQ - 1, &[segment::MAX_SEQ - 1]);
    let bus = EventBus::new(1 << 10);
    let e = Journal::start(cfg(&dir), &bus, encoder()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    assert!(e.to_string().contains("move it aside"), "{e}");
    assert_eq!(bus.head(), 0, "nothing numbered from it");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_damaged_identity_is_replaced_never_fatal() {
    let dir = tmp("id");
    let bus = EventBus::new(1 << 10);
    let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
    let id = j.id().to_string();
    j.shutdown();
    for junk in [&b"not an id \xff"[..], &[b'a'; 5000], b""] {
        std::fs::write(dir.join("id"), junk).unwrap();
        let bus = EventBus::new(1 << 10);
        let j = Journal::start(cfg(&dir), &bus, encoder()).unwrap();
        assert_ne!(j.id(), id);
        assert!(j.id().len() == 36, "{}", j.id());
        j.shutdown();
    }
    std::fs::remove_dir_all(dir).unwrap();
}
