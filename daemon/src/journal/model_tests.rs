//! The journal against a model: random sequences of writes, failed writes,
//! rotations and retention (small segments, a small size limit), clean
//! restarts and crashes with a torn tail, and reads from random points, by
//! new readers and by one that follows the writer; every read must return
//! exactly the model's events, and gaps exactly where the model has none.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use proptest::prelude::*;

use super::tests::{cfg, encoder, publish, tmp, wait_written};
use super::{Item, Journal, Reader, Start, segment};
use crate::events::EventBus;

#[derive(Debug, Clone)]
enum Op {
    /// Events published (and written) together.
    Write(u8),
    /// One event whose write fails (half written, then ENOSPC).
    FailWrite,
    /// Stop cleanly and start again.
    Restart,
    /// A crash that left bytes of an unfinished batch after the last
    /// record.
    CrashWithGarbage(u8),
    /// A crash in the middle of the last record: its last bytes missing.
    CrashTearingLast(u8),
    /// A new reader from after this point (a fraction of the head, in
    /// 1/16ths; 17 and up: past the head).
    Read(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..12).prop_map(Op::Write),
        2 => Just(Op::FailWrite),
        1 => Just(Op::Restart),
        1 => (1u8..40).prop_map(Op::CrashWithGarbage),
        1 => (1u8..24).prop_map(Op::CrashTearingLast),
        2 => (0u8..20).prop_map(Op::Read),
    ]
}

/// What must be read back.
#[derive(Debug, Default)]
struct Model {
    /// Events on disk: seq -> payload.
    events: BTreeMap<u64, String>,
    /// Last sequence number given.
    head: u64,
    /// Events below this were deleted by retention (the oldest segment's
    /// first number).
    cutoff: u64,
}

impl Model {
    /// The items a reader from after `after` must return.
    fn expect(&self, after: u64) -> Vec<String> {
        let mut out = Vec::new();
        let mut prev = after;
        for (&seq, payload) in self.events.range(after.saturating_add(1)..) {
            if seq < self.cutoff {
                continue;
            }
            if seq > prev + 1 {
                out.push(format!("gap {}-{}", prev + 1, seq - 1));
            }
            out.push(format!("{seq}={payload}"));
            prev = seq;
        }
        out
    }
}

fn show(items: Vec<Item>) -> Vec<String> {
    items
        .into_iter()
        .map(|i| match i {
            Item::Event(r) => format!("{}={}", r.seq, String::from_utf8(r.payload).unwrap()),
            Item::Gap { first, last } => format!("gap {first}-{last}"),
        })
        .collect()
}

fn drain(r: &mut Reader) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let b = r.next_batch(5, u64::MAX).unwrap();
        if b.is_empty() {
            return out;
        }
        out.extend(show(b));
    }
}

/// A journal instance with its bus and a reader following it from its
/// start.
struct Running {
    bus: EventBus,
    j: Arc<Journal>,
    follower: Reader,
    followed: Vec<String>,
    /// Where the follower started.
    from: u64,
}

fn start(dir: &std::path::Path) -> Running {
    let mut c = cfg(dir);
    c.segment_bytes = 300;
    c.max_bytes = 1200;
    let bus = EventBus::new(1 << 12);
    let j = Journal::start(c, &bus, encoder()).unwrap();
    let from = bus.head();
    Running {
        follower: j.reader(Start::AfterSeq(from)),
        followed: Vec::new(),
        from,
        bus,
        j,
    }
}

/// The oldest segment's first number (what retention kept).
fn oldest(dir: &std::path::Path) -> u64 {
    segment::list(dir)
        .unwrap()
        .first()
        .map_or(0, |s| s.first_seq)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tmp("model");
    let mut m = Model::default();
    let mut r = start(&dir);
    let mut tid = 0i32;
    for op in ops {
        match op {
            Op::Write(n) => {
                for _ in 0..n {
                    publish(&r.bus, tid..tid + 1);
                    m.head += 1;
                    prop_assert_eq!(r.bus.head(), m.head);
                    m.events.insert(m.head, tid.to_string());
                    tid += 1;
                }
                wait_written(&r.j, m.head);
            }
            Op::FailWrite => {
                let before = r.j.figures().write_lost;
                r.j.cfg.faults.writes.store(1, Ordering::Relaxed);
                publish(&r.bus, tid..tid + 1);
                m.head += 1;
                wait_written(&r.j, m.head);
                // The fault may have gone to the segment opened at start:
                // then this event was written.
                let lost = r.j.figures().write_lost - before;
                prop_assert!(lost <= 1);
                if lost == 0 {
                    m.events.insert(m.head, tid.to_string());
                }
                r.j.cfg.faults.writes.store(0, Ordering::Relaxed);
                tid += 1;
            }
            Op::Restart | Op::CrashWithGarbage(_) | Op::CrashTearingLast(_) => {
                // What the follower read so far: exactly the model's.
                r.followed.extend(drain(&mut r.follower));
                check_followed(&r, &m, oldest(&dir))?;
                r.j.shutdown();
                let newest = segment::list(&dir).unwrap().pop();
                match (&op, newest) {
                    (Op::CrashWithGarbage(n), Some(s)) => {
                        let mut b = std::fs::read(&s.path).unwrap();
                        b.extend(std::iter::repeat_n(0xa5u8, usize::from(*n)));
                        std::fs::write(&s.path, b).unwrap();
                    }
                    (Op::CrashTearingLast(n), Some(s)) => {
                        let scan = segment::scan(&s.path, s.first_seq).unwrap();
                        // Only a segment with a record; a record is at least
                        // 25 bytes, so the cut stays inside the last one.
                        if let Some(last) = scan.last_seq {
                            let len = scan.valid_len - u64::from(*n);
                            let f = std::fs::OpenOptions::new()
                                .write(true)
                                .open(&s.path)
                                .unwrap();
                            f.set_len(len).unwrap();
                            prop_assert_eq!(m.events.keys().next_back().copied(), Some(last));
                            m.events.remove(&last);
                        }
                    }
                    _ => {}
                }
                r = start(&dir);
                // Numbering goes on after the last event on disk, or after
                // numbers never written (lost at the end): never below an
                // event that is there, never above what was given.
                let head = r.bus.head();
                let last_present = m.events.keys().next_back().copied().unwrap_or(0);
                prop_assert!(
                    head >= last_present && head <= m.head,
                    "head {} after restart, last event {}, given {}",
                    head,
                    last_present,
                    m.head
                );
                m.head = head;
            }
            Op::Read(k) => {
                let after = m.head * u64::from(k) / 16;
                m.cutoff = oldest(&dir);
                let got = show(collect(&r.j, after));
                prop_assert_eq!(got, m.expect(after), "reading after {}", after);
            }
        }
        r.followed.extend(drain(&mut r.follower));
    }
    m.cutoff = oldest(&dir);
    check_followed(&r, &m, m.cutoff)?;
    prop_assert_eq!(show(collect(&r.j, 0)), m.expect(0));
    r.j.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
    Ok(())
}

fn collect(j: &Arc<Journal>, after: u64) -> Vec<Item> {
    let mut rd = j.reader(Start::AfterSeq(after));
    let mut out = Vec::new();
    loop {
        let b = rd.next_batch(7, u64::MAX).unwrap();
        if b.is_empty() {
            return out;
        }
        out.extend(b);
    }
}

/// The follower's items: in order, each number once, events as the model
/// has them, gaps only where it has none (or retention deleted them), and
/// every event the model still has after its start.
fn check_followed(r: &Running, m: &Model, cutoff: u64) -> Result<(), TestCaseError> {
    let mut next = r.from + 1;
    let mut seen = Vec::new();
    for item in &r.followed {
        if let Some(rest) = item.strip_prefix("gap ") {
            let (a, b) = rest.split_once('-').unwrap();
            let (a, b): (u64, u64) = (a.parse().unwrap(), b.parse().unwrap());
            prop_assert_eq!(a, next, "{:?}", r.followed);
            for s in a..=b {
                prop_assert!(
                    !m.events.contains_key(&s) || s < cutoff,
                    "gap over event {} ({:?})",
                    s,
                    r.followed
                );
            }
            next = b + 1;
        } else {
            let (s, payload) = item.split_once('=').unwrap();
            let s: u64 = s.parse().unwrap();
            prop_assert_eq!(s, next, "{:?}", r.followed);
            prop_assert_eq!(m.events.get(&s).map(String::as_str), Some(payload));
            seen.push(s);
            next = s + 1;
        }
    }
    for (&s, _) in m.events.range(r.from + 1..) {
        prop_assert!(seen.contains(&s), "event {} never followed", s);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_journal_reads_back_exactly_what_the_model_holds(
        ops in proptest::collection::vec(op(), 1..40)
    ) {
        run(ops)?;
    }
}
