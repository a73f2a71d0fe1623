//! An event's bytes: the one encoder of events, shared by the journal, the
//! streams and the export, and the one decoder of what they stored
//! (`head.rs` for an event's kind and who it is about, prost for the
//! rest). A hit is encoded straight from the domain event into the bytes
//! of its `wpd.v1.StreamEventsResponse`, without building the message
//! first: the encoding of the events that come by the hundred thousand a
//! second. The bytes are the ones prost makes of `event::event_to_pb`
//! (with `event::locate_hit` when located),
//! field for field and in the same order (checked by the tests below). A
//! place's location fields are encoded once and kept with the cached place
//! (`Place::wire`). Other events go through prost.
//!
//! Each form of an event's bytes (plain, located) is made once and kept
//! with the event (`events::Wire`): the journal's record and every
//! subscriber that sends the event as it is share them.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;
use prost::encoding::{WireType, encoded_len_varint};

pub mod event;
pub mod head;

use crate::events::{Event, EventKind, HitEvent, Owner};
use crate::symbols::locate::{self, Frame, Place};
use event as convert;

/// Appends `e` as `StreamEventsResponse` bytes to `buf` (the journal's
/// encoder), its hit located where the symbolizer already knows the
/// addresses (one cache probe per address; never waits for symbols). Of
/// an event someone is subscribed to, a copy of those bytes is kept in its
/// `events::Wire`, for the subscribers to send as they are.
pub fn encode_event(e: &Event, buf: &mut Vec<u8>) {
    let frames = match &e.kind {
        EventKind::Hit(h) => cached_frames(h),
        _ => None,
    };
    let start = buf.len();
    write(e, frames.as_deref(), Form::Fields, buf);
    if e.wire.subscribed {
        // Encoded in place, and kept: one allocation of its exact size.
        let slot = match frames {
            Some(_) => &e.wire.located,
            None => &e.wire.plain,
        };
        let _ = slot.set(Bytes::copy_from_slice(&buf[start..]));
    }
}

/// The bytes of `e` with no location (a hit's addresses raw), made once.
pub fn plain(e: &Event) -> &Bytes {
    e.wire.plain.get_or_init(|| encoded(e, None, Form::Fields))
}

/// The bytes of hit `e` located with `frames` (its address's, then its
/// callers'), made once: the frames of a hit's addresses are the same for
/// every subscriber. Plain bytes when `frames` is empty.
pub fn located<'a>(e: &'a Event, frames: &[Frame]) -> &'a Bytes {
    e.wire
        .located
        .get_or_init(|| encoded(e, Some(frames), Form::Fields))
}

/// The frames of every address of `h` if the symbolizer's cache knows
/// them all.
pub fn cached_frames(h: &HitEvent) -> Option<Vec<Frame>> {
    let image = h.image.as_ref()?;
    if h.callchain.is_empty() {
        locate::cached_frame(image, h.ip).map(|f| vec![f])
    } else {
        let mut ips = Vec::with_capacity(1 + h.callchain.len());
        ips.push(h.ip);
        ips.extend_from_slice(&h.callchain);
        locate::cached_frames(image, &ips)
    }
}

thread_local! {
    /// Where a subscriber's thread encodes an event before keeping it.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The bytes of hit `e` located with `frames` for a stream that asked
/// for places once and has had the places numbered in `sent`: each place
/// by its number, with its fields too where the stream has not had it
/// (its number is then added to `sent`; a full set is emptied first,
/// [`wpd_proto::places::PLACES_PER_STREAM`]). The form in which the stream
/// has had every place is made once, for every such stream.
pub fn numbered(e: &Event, frames: &[Frame], sent: &mut PlaceSet) -> Bytes {
    if sent.len() >= wpd_proto::places::PLACES_PER_STREAM {
        // Start over, as the client does at this hit: neither end keeps
        // more than that many places per stream.
        sent.clear();
    }
    if frames.iter().all(|f| sent.contains(&f.place.wire.number())) {
        return e
            .wire
            .numbered
            .get_or_init(|| encoded(e, Some(frames), Form::Numbered(&|_| false)))
            .clone();
    }
    let had = sent.clone();
    let bytes = encoded(
        e,
        Some(frames),
        Form::Numbered(&|f| !had.contains(&f.place.wire.number())),
    );
    sent.extend(frames.iter().map(|f| f.place.wire.number()));
    bytes
}

/// The place numbers a stream has had.
pub type PlaceSet = std::collections::HashSet<u64, foldhash::fast::RandomState>;

/// How a located hit gives its places.
#[derive(Clone, Copy)]
enum Form<'a> {
    /// Every field of each (the journal, replays, streams that did not ask
    /// for places once).
    Fields,
    /// By number, and with its fields where this says so.
    Numbered(&'a dyn Fn(&Frame) -> bool),
}

/// `e` encoded into an allocation of its exact size (through this
/// thread's scratch buffer: no growth of the kept one).
fn encoded(e: &Event, frames: Option<&[Frame]>, form: Form<'_>) -> Bytes {
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        write(e, frames, form, buf);
        let kept = Bytes::copy_from_slice(buf);
        if buf.capacity() > 1 << 16 {
            // A huge event (a 64 KiB value): not kept allocated.
            *buf = Vec::new();
        }
        kept
    })
}

/// Appends `e` to `buf`, a hit located with `frames` when given (and not
/// empty), raw otherwise.
fn write(e: &Event, frames: Option<&[Frame]>, form: Form<'_>, buf: &mut Vec<u8>) {
    let EventKind::Hit(h) = &e.kind else {
        convert::event_to_pb(e)
            .encode(buf)
            .expect("a Vec grows as needed");
        return;
    };
    buf.reserve(512);
    uint(buf, 1, e.seq);
    uint(buf, 2, e.time_ns);
    if let Some(o) = &e.owner {
        owner_field(buf, o);
    }
    // A hit's fields take 128 to 16,383 bytes: two bytes of length.
    nested_sized(buf, 10, 2, |b| hit(b, h, frames, form));
}

thread_local! {
    /// The owner field last encoded on this thread, and its bytes: the
    /// hits of one process share their owner (one `Arc` per process), so
    /// a stream of hits encodes it once.
    static LAST_OWNER: std::cell::RefCell<Option<(Arc<Owner>, Vec<u8>)>> =
        const { std::cell::RefCell::new(None) };
}

/// The `owner` field (3) of `o`, from this thread's last encoding when it
/// is the same owner (the same `Arc`, kept alive by the memo: its address
/// cannot be reused while it is kept).
fn owner_field(buf: &mut Vec<u8>, o: &Arc<Owner>) {
    LAST_OWNER.with_borrow_mut(|last| match last {
        Some((kept, bytes)) if Arc::ptr_eq(kept, o) => buf.extend_from_slice(bytes),
        _ => {
            let mut bytes = Vec::with_capacity(32);
            nested(&mut bytes, 3, |b| owner(b, o));
            buf.extend_from_slice(&bytes);
            *last = Some((o.clone(), bytes));
        }
    });
}

/// The fields of a `ProcessOwner`.
fn owner(buf: &mut Vec<u8>, o: &Owner) {
    uint(buf, 1, o.start_time);
    packed(buf, 2, &o.uids);
    packed(buf, 3, &o.gids);
    boolean(buf, 4, o.dumpable);
}

/// The fields of a `Hit`.
fn hit(buf: &mut Vec<u8>, h: &HitEvent, frames: Option<&[Frame]>, form: Form<'_>) {
    uint(buf, 1, h.id.0);
    int32(buf, 2, h.pid);
    int32(buf, 3, h.tid);
    uint(buf, 4, h.ip);
    uint(buf, 5, h.addr);
    uint(buf, 6, u64::from(h.len));
    int32(buf, 7, convert::access_to_pb(h.access) as i32);
    match &h.value {
        Ok(v) => bytes(buf, 8, v),
        Err(why) => bytes(buf, 9, why.as_bytes()),
    }
    uint(buf, 10, h.time_ns);
    uint(buf, 11, h.value_read_ns);
    uint(buf, 12, u64::from(h.cpu));
    boolean(buf, 13, h.stopped);
    if let Some(old) = &h.old_value {
        bytes(buf, 14, old);
    }
    int32(buf, 15, convert::backend_to_pb(h.backend) as i32);
    uint(buf, 16, u64::from(h.piece));
    match frames {
        Some([first, callers @ ..]) => {
            location(buf, 17, first, form);
            for f in callers {
                location(buf, 18, f, form);
            }
        }
        _ => {
            for &ip in &h.callchain {
                nested(buf, 18, |b| uint(b, 1, ip));
            }
        }
    }
    if let Some(note) = h.callchain_note {
        bytes(buf, 19, note.as_bytes());
    }
    uint(buf, 20, h.rate_limited_before);
    if let Some((process, thread)) = &h.names {
        bytes(buf, 21, process.as_bytes());
        bytes(buf, 22, thread.as_bytes());
    }
    int32(
        buf,
        23,
        convert::value_kind_of(h.value_type.as_deref()) as i32,
    );
    if let Some(name) = convert::hit_value_name(h) {
        bytes(buf, 24, name.as_bytes());
    }
}

/// A symbolized frame as a `Location` field: its addresses, then the
/// place's fields (encoded once per cached place), its number, or both.
fn location(buf: &mut Vec<u8>, tag: u32, f: &Frame, form: Form<'_>) {
    let fields = match form {
        Form::Fields => true,
        Form::Numbered(new) => new(f),
    };
    nested(buf, tag, |b| {
        uint(b, 1, f.ip);
        uint(b, 2, f.lookup);
        if fields {
            b.extend_from_slice(f.place.wire.get_or_init(|| place(&f.place)));
        }
        if let Form::Numbered(_) = form {
            uint(b, 14, f.place.wire.number());
        }
    });
}

/// The fields of a `Location` that come from its place (3 to 13).
fn place(p: &Place) -> Vec<u8> {
    let mut b = Vec::with_capacity(256);
    if let Some(function) = &p.function {
        bytes(&mut b, 3, function.as_bytes());
    }
    uint(&mut b, 4, p.function_offset);
    if let Some(file) = &p.file {
        bytes(&mut b, 5, file.as_bytes());
    }
    uint(&mut b, 6, u64::from(p.line));
    uint(&mut b, 7, u64::from(p.column));
    for (function, file, line) in &p.inlined {
        nested(&mut b, 8, |b| {
            bytes(b, 1, function.as_bytes());
            if let Some(file) = file {
                bytes(b, 2, file.as_bytes());
            }
            uint(b, 3, u64::from(*line));
        });
    }
    if let Some(module) = &p.module {
        bytes(&mut b, 9, module.as_bytes());
    }
    if let Some(id) = &p.build_id {
        bytes(&mut b, 10, id);
    }
    uint(&mut b, 11, p.module_address);
    uint(&mut b, 12, p.file_offset.unwrap_or(0));
    boolean(&mut b, 13, p.file_offset.is_some());
    b
}

/// A base-128 varint, least significant group first.
#[inline]
fn varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push(v as u8 | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// A field's key: its number and wire type.
#[inline]
fn key(buf: &mut Vec<u8>, tag: u32, wire: WireType) {
    varint(buf, u64::from(tag << 3 | wire as u32));
}

/// A varint field (uint64, uint32), left out when 0 as proto3 does.
fn uint(buf: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        key(buf, tag, WireType::Varint);
        varint(buf, v);
    }
}

/// An int32 or enum field: negative values take ten bytes, as in protobuf.
fn int32(buf: &mut Vec<u8>, tag: u32, v: i32) {
    uint(buf, tag, i64::from(v) as u64);
}

fn boolean(buf: &mut Vec<u8>, tag: u32, v: bool) {
    uint(buf, tag, u64::from(v));
}

/// A bytes or string field, left out when empty.
fn bytes(buf: &mut Vec<u8>, tag: u32, v: &[u8]) {
    if !v.is_empty() {
        key(buf, tag, WireType::LengthDelimited);
        varint(buf, v.len() as u64);
        buf.extend_from_slice(v);
    }
}

/// A packed repeated uint32 field, left out when empty.
fn packed(buf: &mut Vec<u8>, tag: u32, v: &[u32]) {
    if !v.is_empty() {
        nested(buf, tag, |b| {
            for &x in v {
                varint(b, u64::from(x));
            }
        });
    }
}

/// A length-delimited field whose body `body` appends: its length is
/// written in front once known.
fn nested(buf: &mut Vec<u8>, tag: u32, body: impl FnOnce(&mut Vec<u8>)) {
    nested_sized(buf, tag, 1, body);
}

/// [`nested`], with `guess` bytes set aside for the length: a body whose
/// length needs another number of bytes is moved by the difference.
fn nested_sized(buf: &mut Vec<u8>, tag: u32, guess: usize, body: impl FnOnce(&mut Vec<u8>)) {
    key(buf, tag, WireType::LengthDelimited);
    let at = buf.len();
    buf.resize(at + guess, 0);
    body(buf);
    let len = buf.len() - at - guess;
    let n = encoded_len_varint(len as u64);
    if n > guess {
        buf.splice(at + guess..at + guess, std::iter::repeat_n(0, n - guess));
    } else if n < guess {
        buf.copy_within(at + guess.., at + n);
        buf.truncate(at + n + len);
    }
    let mut v = len as u64;
    for b in &mut buf[at..at + n] {
        *b = (v as u8 & 0x7f) | if v >= 0x80 { 0x80 } else { 0 };
        v >>= 7;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::{Access, BackendKind, WatchId};
    use crate::symbols::Image;

    /// What prost makes of the same event, located as the journal's
    /// encoding has always located it.
    fn by_prost(e: &Event) -> Vec<u8> {
        let mut item = convert::event_to_pb(e);
        if let EventKind::Hit(h) = &e.kind
            && let Some(image) = &h.image
        {
            let mut ips = vec![h.ip];
            ips.extend_from_slice(&h.callchain);
            if let Some(frames) = locate::cached_frames(image, &ips) {
                convert::locate_hit(&mut item, &frames);
            }
        }
        item.encode_to_vec()
    }

    fn check(e: &Event) {
        let mut fast = vec![0xEE];
        encode_event(e, &mut fast);
        assert_eq!(fast[0], 0xEE, "appended, not overwritten");
        assert_eq!(&fast[1..], by_prost(e).as_slice(), "{e:?}");
        assert!(
            e.wire.plain.get().is_none() && e.wire.located.get().is_none(),
            "nothing kept with nobody subscribed"
        );
        // The place's memo in use: the same bytes again.
        let mut again = Vec::new();
        encode_event(e, &mut again);
        assert_eq!(again, fast[1..]);
        // Subscribed: the same bytes, kept with the event.
        let mut shared = e.clone();
        shared.wire.subscribed = true;
        let mut kept = vec![0xEE];
        encode_event(&shared, &mut kept);
        assert_eq!(kept, fast);
        let slot = match &shared.kind {
            EventKind::Hit(h) if cached_frames(h).is_some() => &shared.wire.located,
            _ => &shared.wire.plain,
        };
        assert_eq!(slot.get().map(|b| &b[..]), Some(&fast[1..]));
    }

    /// A stream and its client forget their places at the same hit: a
    /// place sent before the start-over and named again after it is sent
    /// with its fields again, and every hit fills in.
    #[test]
    fn a_stream_and_its_client_start_over_together() {
        use wpd_proto::places::{PLACES_PER_STREAM, Places};
        use wpd_proto::v1::stream_events_response::Event as E;
        let mut sent = PlaceSet::default();
        let mut client = Places::new();
        let made: Vec<Arc<Place>> = (0..PLACES_PER_STREAM + 3)
            .map(|i| {
                let mut p = places()[0].clone();
                p.function = Some(format!("f{i}"));
                Arc::new(p)
            })
            .collect();
        // Every place once, then the first three again (after the start
        // over), then a hit at the last one (known on both ends).
        let order = (0..made.len()).chain(0..3).chain([made.len() - 1]);
        let mut with_fields = 0;
        for i in order {
            let frames = [Frame {
                ip: 0x1000 + i as u64,
                lookup: 0xfff + i as u64,
                place: made[i].clone(),
            }];
            let e = event(hit(), None);
            let bytes = numbered(&e, &frames, &mut sent);
            let mut m = wpd_proto::v1::StreamEventsResponse::decode(&bytes[..]).unwrap();
            let Some(E::Hit(h)) = &m.event else {
                unreachable!()
            };
            let loc = h.location.as_ref().unwrap();
            assert_eq!(loc.place_id, made[i].wire.number());
            with_fields += usize::from(!loc.function.is_empty());
            client.fill_event(&mut m);
            let Some(E::Hit(h)) = &m.event else {
                unreachable!()
            };
            let loc = h.location.as_ref().unwrap();
            assert_eq!(loc.function, format!("f{i}"), "hit at place {i}");
            assert!(sent.len() <= PLACES_PER_STREAM && client.len() <= PLACES_PER_STREAM);
        }
        // Every place's first time, and the three after the start over.
        assert_eq!(with_fields, made.len() + 3);
    }

    pub(crate) fn hit() -> HitEvent {
        HitEvent {
            id: WatchId(7),
            piece: 0,
            pid: 4242,
            tid: 4243,
            ip: 0x5555_5555_1234,
            addr: 0x5555_5557_0040,
            len: 8,
            access: Access::Write,
            value: Ok(vec![1, 0, 0, 0, 0, 0, 0, 0]),
            time_ns: 1_800_000_000_000_000_000,
            value_read_ns: 1_800_000_000_000_000_300,
            cpu: 1,
            stopped: false,
            old_value: None,
            backend: BackendKind::Perf,
            image: None,
            callchain: Vec::new(),
            callchain_note: None,
            rate_limited_before: 0,
            names: Some((Arc::from("fuzzer"), Arc::from("pool-12"))),
            value_type: None,
        }
    }

    fn event(h: HitEvent, owner: Option<Owner>) -> Event {
        Event {
            seq: 123_456,
            time_ns: 1_800_000_000_000_001_000,
            owner: owner.map(Arc::new),
            kind: EventKind::Hit(h),
            wire: Default::default(),
        }
    }

    pub(crate) fn owner() -> Owner {
        Owner {
            start_time: 987_654,
            uids: [1000, 0, 1000],
            gids: [100, 100, 0],
            dumpable: true,
        }
    }

    /// A place with every field set, and a sparse one.
    pub(crate) fn places() -> Vec<Place> {
        vec![
            Place {
                function: Some("store".into()),
                function_offset: 0x1c,
                file: Some("/src/wpd-target.rs".into()),
                line: 84,
                column: 9,
                inlined: vec![
                    (
                        "write_volatile<u64>".into(),
                        Some("ptr/mod.rs".into()),
                        2178,
                    ),
                    ("run".into(), None, 0),
                ],
                module: Some("/usr/bin/wpd-target".into()),
                build_id: Some(Arc::from(&[0xab; 20][..])),
                module_address: 0x1234,
                file_offset: Some(0x234),
                ..Place::default()
            },
            Place {
                module_address: 0x99,
                file_offset: Some(0),
                ..Place::default()
            },
            Place::default(),
        ]
    }

    #[test]
    fn raw_hits_encode_as_prost_does() {
        check(&event(hit(), Some(owner())));
        check(&event(hit(), None));
        let mut h = hit();
        h.value = Err("EFAULT reading 8 bytes".into());
        h.old_value = Some(vec![9; 8]);
        h.stopped = true;
        h.piece = 2;
        h.rate_limited_before = 17;
        h.names = None;
        h.backend = BackendKind::Ptrace;
        h.access = Access::ReadWrite;
        h.pid = -1;
        h.cpu = 0;
        check(&event(h, Some(owner())));
        let mut h = hit();
        h.value = Ok(Vec::new());
        h.old_value = Some(Vec::new());
        h.names = Some((Arc::from(""), Arc::from("t")));
        check(&event(h, None));
        let mut h = hit();
        h.callchain = vec![0x7000, 0x7100];
        h.callchain_note = Some(crate::events::NO_FRAME_POINTER);
        check(&event(h, None));
        let mut o = owner();
        o.uids = [0; 3];
        o.dumpable = false;
        check(&event(hit(), Some(o)));
        // Typed values: the kind, and an enumerator's name when one has the
        // value (a negative kind's varint included).
        let state = Arc::new(crate::value::ValueType {
            kind: crate::value::Kind::Signed,
            size: 8,
            name: "enum state".into(),
            enumerators: Some(vec![("IDLE".into(), 0), ("ONE".into(), 1)]),
        });
        for (t, value) in [
            (state.clone(), 1u64),
            (state, 7),
            (double(), 0xc071126666666666),
        ] {
            let mut h = hit();
            h.value = Ok(value.to_le_bytes().to_vec());
            h.value_type = Some(t);
            check(&event(h, Some(owner())));
        }
    }

    fn double() -> Arc<crate::value::ValueType> {
        Arc::new(crate::value::ValueType {
            kind: crate::value::Kind::Float,
            size: 8,
            name: "volatile double".into(),
            enumerators: None,
        })
    }

    #[test]
    fn located_hits_encode_as_prost_does() {
        for (n, place) in places().into_iter().enumerate() {
            let image = Image::new(4242);
            let h = hit();
            image.insert_for_tests(h.ip - 1, Arc::new(place.clone()));
            let mut located = hit();
            located.image = Some(image.clone());
            check(&event(located, Some(owner())));
            // A call chain: located only when every address is cached.
            let mut chain = hit();
            chain.image = Some(image.clone());
            chain.callchain = vec![0x7000 + n as u64, 0x7100];
            check(&event(chain.clone(), None));
            image.insert_for_tests(0x7000 + n as u64 - 1, Arc::new(places()[0].clone()));
            image.insert_for_tests(0x7100 - 1, Arc::new(place));
            check(&event(chain, None));
            // An address not cached: raw.
            let mut unknown = hit();
            unknown.ip = 0x9999;
            unknown.image = Some(image);
            check(&event(unknown, None));
        }
    }

    #[test]
    fn an_owner_is_encoded_again_once_another_one_comes() {
        let first = Arc::new(owner());
        let mut o = owner();
        o.uids = [0; 3];
        o.start_time = 5;
        let second = Arc::new(o);
        let same_as_first = Arc::new(owner());
        for o in [&first, &first, &second, &first, &same_as_first, &second] {
            let e = Event {
                seq: 1,
                time_ns: 2,
                owner: Some(o.clone()),
                kind: EventKind::Hit(hit()),
                wire: Default::default(),
            };
            check(&e);
        }
        // Another thread's memo is its own.
        let e = Event {
            seq: 1,
            time_ns: 2,
            owner: Some(second.clone()),
            kind: EventKind::Hit(hit()),
            wire: Default::default(),
        };
        std::thread::spawn(move || check(&e)).join().unwrap();
    }

    #[test]
    fn short_hits_move_back_into_a_one_byte_length() {
        let mut h = hit();
        h.names = None;
        h.value = Ok(Vec::new());
        h.time_ns = 0;
        h.value_read_ns = 0;
        check(&event(h, None));
    }

    #[test]
    fn long_bodies_get_their_whole_length() {
        let mut h = hit();
        h.value = Ok(vec![7; 300]);
        h.names = Some((Arc::from("p".repeat(20_000)), Arc::from("t")));
        check(&event(h, Some(owner())));
    }

    #[test]
    fn other_events_go_through_prost() {
        let e = Event {
            seq: 9,
            time_ns: 10,
            owner: None,
            kind: EventKind::ThreadExited { pid: 1, tid: 2 },
            wire: Default::default(),
        };
        check(&e);
    }

    #[test]
    fn the_kept_forms_are_prost_s_and_made_once() {
        let image = Image::new(4242);
        let mut h = hit();
        h.callchain = vec![0x7000, 0x7100];
        h.image = Some(image.clone());
        let e = event(h.clone(), Some(owner()));
        // Plain: no location even where the addresses are cached.
        for (n, place) in places().into_iter().enumerate() {
            image.insert_for_tests(h.ip - 1, Arc::new(place.clone()));
            image.insert_for_tests(0x7000 - 1, Arc::new(places()[n % 2].clone()));
            image.insert_for_tests(0x7100 - 1, Arc::new(place));
        }
        let raw = convert::event_to_pb(&e).encode_to_vec();
        assert_eq!(&plain(&e)[..], raw.as_slice());
        assert_eq!(plain(&e).as_ptr(), plain(&e).as_ptr(), "made once");
        let frames = cached_frames(&h).expect("cached");
        let mut item = convert::event_to_pb(&e);
        convert::locate_hit(&mut item, &frames);
        assert_eq!(&located(&e, &frames)[..], item.encode_to_vec().as_slice());
        assert_ne!(&located(&e, &frames)[..], raw.as_slice());
        // No frames: the plain bytes.
        let again = event(h, None);
        assert_eq!(
            &located(&again, &[])[..],
            convert::event_to_pb(&again).encode_to_vec().as_slice()
        );
        let exited = Event {
            seq: 3,
            time_ns: 4,
            owner: Some(Arc::new(owner())),
            kind: EventKind::ProcessExited {
                pid: 5,
                watchpoints: vec![WatchId(1), WatchId(2)],
            },
            wire: Default::default(),
        };
        assert_eq!(
            &plain(&exited)[..],
            convert::event_to_pb(&exited).encode_to_vec().as_slice()
        );
    }
}
