//! The journal's costs (`cargo bench -p wpd --bench journal`): how many
//! events a second its writer journals (encoding included) against the
//! floor of writing the same bytes with the same batching and syncs; what
//! 100,000 events a second cost (writer CPU per event, the publishing
//! thread's CPU per event with the journal, which encodes there, and
//! without, fdatasync count and time, losses); how long reopening a journal of 1,000,000 events takes.
//! Events are hits as the daemon publishes them (8-byte value, names, the
//! process's owner and program image, nothing symbolized in it).

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wpd::events::{EventBus, EventKind, HitEvent, Owner};
use wpd::journal::{Config, Journal};
use wpd::model::{Access, BackendKind, WatchId};

/// The hits' process: its owner and its program image, one of each per
/// process as in the daemon.
fn process() -> &'static (Arc<Owner>, Arc<wpd::symbols::Image>) {
    static P: std::sync::OnceLock<(Arc<Owner>, Arc<wpd::symbols::Image>)> =
        std::sync::OnceLock::new();
    P.get_or_init(|| {
        let owner = Owner {
            start_time: 123_456_789,
            uids: [1000; 3],
            gids: [1000; 3],
            dumpable: true,
        };
        (Arc::new(owner), wpd::symbols::Image::new(4242))
    })
}

fn owner() -> Option<Arc<Owner>> {
    Some(process().0.clone())
}

fn hit(i: u64) -> EventKind {
    EventKind::Hit(HitEvent {
        id: WatchId(7),
        piece: 0,
        pid: 4242,
        tid: 4243 + (i % 16) as i32,
        ip: 0x5555_5555_1234 + (i % 64),
        addr: 0x5555_5557_0040,
        len: 8,
        access: Access::Write,
        value: Ok(i.to_le_bytes().to_vec()),
        time_ns: 1_800_000_000_000_000_000 + i * 1000,
        value_read_ns: 1_800_000_000_000_000_000 + i * 1000 + 300,
        cpu: (i % 2) as u32,
        stopped: false,
        old_value: None,
        backend: BackendKind::Perf,
        image: Some(process().1.clone()),
        callchain: Vec::new(),
        callchain_note: None,
        rate_limited_before: 0,
        names: Some((Arc::from("fuzzer"), Arc::from("pool-12"))),
        value_type: None,
    })
}

fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("wpd-bench-journal-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// CPU time of this process's thread named `name`, in ns.
fn thread_cpu_ns(name: &str) -> u64 {
    let hz = 100; // USER_HZ on Linux
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let p = e.path();
        if std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim() == name) {
            let stat = std::fs::read_to_string(p.join("stat")).unwrap();
            let rest = stat.rsplit_once(')').unwrap().1;
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|w| w.parse().unwrap_or(0))
                .collect();
            return (f[11] + f[12]) * 1_000_000_000 / hz;
        }
    }
    0
}

fn start(d: &std::path::Path, bus: &EventBus) -> Arc<Journal> {
    Journal::start(Config::new(d.join("journal")), bus, wpd::journal::encoder()).unwrap()
}

/// Publishes `n` events as fast as the writer takes them without loss
/// (never more than half the ring ahead of it); events per second.
fn max_rate(n: u64) -> (f64, u64) {
    let d = dir("max");
    let bus = EventBus::new(1 << 16);
    let j = start(&d, &bus);
    let t = Instant::now();
    // In bursts of 4,096, as the drain publishes what one pass read.
    for start in (0..n).step_by(4096) {
        while bus.head() - j.written_seq() > 1 << 15 {
            std::thread::yield_now();
        }
        bus.burst(|| {
            for i in start..(start + 4096).min(n) {
                bus.publish_as(hit(i), owner());
            }
        });
    }
    while j.written_seq() < n {
        std::thread::sleep(Duration::from_micros(100));
    }
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let bytes = j.figures().bytes;
    j.shutdown();
    let _ = std::fs::remove_dir_all(&d);
    (rate, bytes / n)
}

/// The floor: the same records, already encoded, written 4,096 per write
/// with an fdatasync every 100 ms.
fn floor_rate(n: u64, record: &[u8]) -> f64 {
    let d = dir("floor");
    let mut f = std::fs::File::create(d.join("floor")).unwrap();
    let mut batch = Vec::with_capacity(record.len() * 4096);
    let t = Instant::now();
    let mut synced = Instant::now();
    let mut i = 0;
    while i < n {
        batch.clear();
        for _ in 0..4096.min(n - i) {
            batch.extend_from_slice(record);
            i += 1;
        }
        f.write_all(&batch).unwrap();
        if synced.elapsed() >= Duration::from_millis(100) {
            f.sync_data().unwrap();
            synced = Instant::now();
        }
    }
    f.sync_data().unwrap();
    let rate = n as f64 / t.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&d);
    rate
}

/// CPU time of the calling thread, ns.
fn own_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer for the calling thread's clock.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The publishing thread's CPU per hit published as the daemon publishes
/// hits (`publish_kept`), 100,000 a second for `secs` seconds, without a
/// journal: the baseline of the publisher's share below.
fn paced_without_journal(secs: u64) -> u64 {
    let bus = EventBus::new(1 << 16);
    let t = Instant::now();
    let total = secs * 100_000;
    let mut spent = 0;
    let mut i = 0u64;
    while i < total {
        let due = Duration::from_micros(i / 100 * 1000);
        let now = t.elapsed();
        if now < due {
            std::thread::sleep(due - now);
        }
        let c = own_cpu_ns();
        for _ in 0..100 {
            drop(bus.publish_kept(hit(i), owner()));
            i += 1;
        }
        spent += own_cpu_ns() - c;
    }
    spent / total
}

/// 100,000 events a second for `secs` seconds, a burst of 100 every
/// millisecond.
fn paced(secs: u64) {
    let d = dir("paced");
    let bus = EventBus::new(1 << 16);
    let j = start(&d, &bus);
    std::thread::sleep(Duration::from_millis(50));
    let cpu0 = thread_cpu_ns("wpd-journal");
    let mut publisher = 0;
    let t = Instant::now();
    let mut i = 0u64;
    let total = secs * 100_000;
    while i < total {
        let due = Duration::from_micros(i / 100 * 1000);
        let now = t.elapsed();
        if now < due {
            std::thread::sleep(due - now);
        }
        let c = own_cpu_ns();
        // One burst, as the drain publishes what one pass read.
        bus.burst(|| {
            for _ in 0..100 {
                drop(bus.publish_kept(hit(i), owner()));
                i += 1;
            }
        });
        publisher += own_cpu_ns() - c;
    }
    while j.written_seq() < total {
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = t.elapsed();
    std::thread::sleep(Duration::from_millis(150));
    let cpu = thread_cpu_ns("wpd-journal") - cpu0;
    let f = j.figures();
    let bare = paced_without_journal(secs);
    println!(
        "| 100,000 events/s for {secs} s | {total} events in {:.2} s | lost {} | writer CPU {} ns/event | publisher CPU {} ns/event (encoding into the queue included) against {bare} ns without a journal | {} fdatasyncs, mean {:.2} ms, max {:.2} ms | durable through {} |",
        elapsed.as_secs_f64(),
        f.lagged,
        cpu / total,
        publisher / total,
        f.fsyncs,
        f.fsync_us as f64 / f.fsyncs.max(1) as f64 / 1000.0,
        f.fsync_max_us as f64 / 1000.0,
        f.durable_seq
    );
    j.shutdown();
    let _ = std::fs::remove_dir_all(&d);
}

/// Reopening a journal of `n` events.
fn reopen(n: u64) {
    let d = dir("reopen");
    let bus = EventBus::new(1 << 16);
    let j = start(&d, &bus);
    for i in 0..n {
        bus.publish_as(hit(i), owner());
        if i % 4096 == 0 {
            while bus.head() - j.written_seq() > 1 << 15 {
                std::thread::yield_now();
            }
        }
    }
    while j.written_seq() < n {
        std::thread::sleep(Duration::from_millis(1));
    }
    j.shutdown();
    let segments = j.figures().segments;
    drop(j);
    let bus = EventBus::new(1 << 16);
    let t = Instant::now();
    let j = start(&d, &bus);
    let took = t.elapsed();
    assert_eq!(bus.head(), n);
    println!(
        "| reopen after {n} events ({segments} segments) | {:.1} ms |",
        took.as_secs_f64() * 1000.0
    );
    j.shutdown();
    let _ = std::fs::remove_dir_all(&d);
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is ignored.
    let n = 1_000_000;
    let mut record = Vec::new();
    {
        use prost::Message;
        let bus = EventBus::new(4);
        let ev = bus.publish_kept(hit(1), owner());
        let mut payload = Vec::new();
        (wpd::journal::encoder())(&ev, &mut payload);
        wpd::journal::segment::encode_record(&mut record, 1, 1, &payload);
        let _ = wpd_proto::v1::StreamEventsResponse::decode(payload.as_slice()).unwrap();
    }
    println!("# journal ({} bytes per hit record)\n", record.len());
    println!("| what | events/s | ratio to the floor |");
    println!("|---|---:|---:|");
    for _ in 0..2 {
        let floor = floor_rate(n, &record);
        let (rate, per) = max_rate(n);
        println!(
            "| journal, {n} hits ({per} B/event on disk) | {rate:.0} | {:.3} |",
            rate / floor
        );
        println!(
            "| floor: the same records pre-encoded, same batching and syncs | {floor:.0} | 1 |"
        );
    }
    println!();
    paced(3);
    paced(3);
    println!();
    reopen(n);
}
