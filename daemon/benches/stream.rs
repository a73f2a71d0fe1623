//! What a `StreamEvents` subscriber's stream spends to put one hit into
//! tonic's send buffer (`cargo bench -p wpd --bench stream`), the message
//! path against the shared bytes, in one run:
//!
//! - message: `convert::event_to_pb`, `convert::locate_hit` for a located
//!   hit, then prost's encoding into the buffer (what every subscriber did
//!   for every event before the bytes were shared, and what a caller in a
//!   nested pid namespace still gets);
//! - bytes: the event's kept bytes (`wire::plain` / `wire::located`, made
//!   here by the first and only subscriber) copied into the buffer;
//! - with the journal: the journal's encoder first (on the publishing
//!   thread, into its queue), then the subscriber, for both paths: the
//!   message path encodes the event twice, the bytes path once.
//!
//! Each figure is CPU ns per hit with the cost of making the event itself
//! taken off (a row of its own), medians of alternated rounds.

use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use prost::Message;
use wpd::events::{Event, EventKind, HitEvent, Owner, Wire};
use wpd::model::{Access, BackendKind, WatchId};
use wpd::symbols::locate::Frame;
use wpd::symbols::{Image, Symbols};
use wpd::wire::{self, event as convert};

const N: u64 = 100_000;
const ROUNDS: usize = 7;

fn owner() -> Arc<Owner> {
    static O: std::sync::OnceLock<Arc<Owner>> = std::sync::OnceLock::new();
    O.get_or_init(|| {
        Arc::new(Owner {
            start_time: 123_456_789,
            uids: [1000; 3],
            gids: [1000; 3],
            dumpable: true,
        })
    })
    .clone()
}

fn event(i: u64, subscribed: bool, at: Option<&Frame>, image: Option<&Arc<Image>>) -> Event {
    Event {
        seq: i + 1,
        time_ns: 1_800_000_000_000_000_000 + i * 1000,
        owner: Some(owner()),
        kind: EventKind::Hit(HitEvent {
            id: WatchId(7),
            piece: 0,
            pid: 4242,
            tid: 4243,
            ip: at.map_or(0x5555_5555_1234, |f| f.ip),
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
            image: image.cloned(),
            callchain: Vec::new(),
            callchain_note: None,
            rate_limited_before: 0,
            names: Some((Arc::from("ct-pie"), Arc::from("ct-pie"))),
            value_type: None,
        }),
        wire: Wire {
            subscribed,
            ..Wire::default()
        },
    }
}

/// A located hit's frame: an address of this program, symbolized by the
/// daemon's symbolizer (which caches it in `image`, where the journal's
/// encoder finds it).
fn symbolized() -> (Arc<Image>, Vec<Frame>) {
    let symbols = Arc::new(Symbols::new());
    let image = Image::new(std::process::id() as i32);
    let ip = run as fn(Path, bool, bool, &[Frame], &Arc<Image>) -> f64 as usize as u64 + 8;
    let frames = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(symbols.frames(&image, &[ip]));
    assert!(
        frames[0].place.function.is_some() && frames[0].place.file.is_some(),
        "this program's own address not symbolized: {:?}",
        frames[0].place
    );
    (image, frames)
}

#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// Making the events only.
    Make,
    Message,
    Bytes,
}

/// CPU ns per hit of `path`, located or not, with the journal's encoder
/// first or not.
fn run(path: Path, located: bool, journal: bool, frames: &[Frame], image: &Arc<Image>) -> f64 {
    let mut out = BytesMut::with_capacity(64 << 10);
    let mut queue: Vec<u8> = Vec::with_capacity(64 << 10);
    let encoder = wire::encode_event;
    let t0 = cpu_ns();
    for i in 0..N {
        // The message path's journal keeps nothing, as before the bytes
        // were shared.
        let keep = journal && path == Path::Bytes;
        let ev = if located {
            event(i, keep, frames.first(), Some(image))
        } else {
            event(i, keep, None, None)
        };
        if journal && path != Path::Make {
            encoder(&ev, &mut queue);
            if queue.len() > 60 << 10 {
                queue.clear();
            }
        }
        match path {
            Path::Make => {}
            Path::Message => {
                let mut item = convert::event_to_pb(&ev);
                if located {
                    convert::locate_hit(&mut item, frames);
                }
                item.encode(&mut out).unwrap();
            }
            Path::Bytes => {
                let b = if located {
                    wire::located(&ev, frames)
                } else {
                    wire::plain(&ev)
                };
                let sent = b.clone();
                out.put_slice(&sent);
            }
        }
        if out.len() > 60 << 10 {
            out.clear();
        }
        std::hint::black_box(&ev);
    }
    (cpu_ns() - t0) as f64 / N as f64
}

fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let (image, frames) = symbolized();
    println!(
        "stream: CPU ns per hit into tonic's buffer, {N} hits × {ROUNDS} rounds (medians), the event's own making taken off\n"
    );
    println!("| hit | journal | message (before) | shared bytes | bytes / message |");
    println!("|---|---|---:|---:|---:|");
    for located in [false, true] {
        for journal in [false, true] {
            let (mut make, mut msg, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                make.push(run(Path::Make, located, journal, &frames, &image));
                msg.push(run(Path::Message, located, journal, &frames, &image));
                bytes.push(run(Path::Bytes, located, journal, &frames, &image));
            }
            let make = median(make);
            let (m, b) = (median(msg) - make, median(bytes) - make);
            println!(
                "| {} | {} | {m:.0} | {b:.0} | {:.2}× |",
                if located { "located" } else { "raw" },
                if journal {
                    "on (its encoding included)"
                } else {
                    "off"
                },
                b / m
            );
        }
    }
}
