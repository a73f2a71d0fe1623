//! The live event feed of one `StreamEvents` subscriber: [`EventFeed`]
//! reads the event bus, keeps what this subscriber may see and asked for,
//! symbolizes hits on the way out, and is paced ([`Pacer`]) so that a busy
//! bus wakes the connection at most once per [`PACE`].
//!
//! An event goes out as its wire bytes (`wire.rs`), made once per event and
//! shared with the journal and every other subscriber, unless this
//! subscriber numbers processes differently (a caller in a nested pid
//! namespace): then it goes out as a message of its own, translated
//! (`nsview.rs`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio_stream::Stream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::Status;
use wpd_proto::v1 as pb;

use super::nsview;
use crate::authz::{self, Caller};
use crate::convert;
use crate::events::{Event, EventKind};
use crate::model::{Pid, WatchId};
use crate::service::leases;
use crate::symbols::locate::Frame;

/// Least time between two wake-ups of a subscriber's stream while events
/// keep coming. An event after a quiet spell goes out at once; the next
/// ones within this time wait for its end and go out together. Each
/// wake-up costs the daemon tens of µs (worker unpark, HTTP/2 write), as
/// much as the work of a ptrace hit itself.
const PACE: std::time::Duration = std::time::Duration::from_millis(1);

/// One subscriber's event stream, polled by tonic itself: the event bus
/// wakes the connection's task directly, with no task or channel in
/// between, and events that are already queued go out together (tonic
/// encodes every ready message into one HTTP/2 write). While events keep
/// coming, the stream wakes at most once per [`PACE`]. It ends at daemon
/// shutdown; tonic drops it when the client goes away.
pub(super) struct EventFeed {
    /// Sent before any event (the lease's name).
    greeting: Option<pb::StreamEventsResponse>,
    /// The subscriber's numbers are translated (`nsview`): each event is a
    /// message of its own, never the shared bytes.
    translated: bool,
    /// Ends with the stream (dropped with it).
    _lease: Option<leases::LeaseGuard>,
    events: tokio_stream::wrappers::BroadcastStream<Arc<Event>>,
    /// This subscriber's loss accounting.
    sub: crate::events::SubGuard,
    shutdown: tokio_stream::wrappers::WatchStream<bool>,
    caller: Caller,
    /// Only this process (0: all).
    pid: Pid,
    /// Only hits of these watchpoints (empty: all).
    ids: Vec<WatchId>,
    hits_only: bool,
    /// Who this subscriber may see, decided once per process identity.
    visible: authz::Visibility,
    /// An event taken from the bus and held until the pacer lets it go.
    stash: Option<Result<Arc<Event>, BroadcastStreamRecvError>>,
    /// The bus had nothing left at the last poll.
    dry: bool,
    pacer: Pacer,
    /// Symbolizes hits (None: the subscriber asked for raw hits).
    symbols: Option<Arc<crate::symbols::Symbols>>,
    /// A hit waiting for the symbolizer (its addresses were not cached).
    locating: Option<(Waiting, Locating)>,
    /// The places this stream has had, when it asked for each place once
    /// (`places_once`; not for translated messages, which carry every
    /// field).
    places: Option<crate::wire::PlaceSet>,
}

/// A hit waiting for its frames.
enum Waiting {
    /// To go out as its shared bytes.
    Event(Arc<Event>),
    /// To go out as this subscriber's own message.
    Message(Box<pb::StreamEventsResponse>),
}

/// The symbolizer's answer for one hit.
type Locating = Pin<Box<dyn Future<Output = Vec<crate::symbols::Frame>> + Send>>;

/// Spaces a stream's wake-ups at least [`PACE`] apart while events keep
/// coming; the first wake-up after a quiet spell is not delayed.
#[derive(Default)]
struct Pacer {
    /// When the stream last woke up to a new event (or will, when `wait`
    /// ends).
    woke_at: Option<tokio::time::Instant>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Pacer {
    /// The stream woke up to a new event after running dry: Ready to
    /// deliver it now, Pending until the pace ends (`cx` is woken then).
    fn woken(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        let now = tokio::time::Instant::now();
        match self.woke_at {
            Some(prev) if now < prev + PACE => {
                self.woke_at = Some(prev + PACE);
                let mut wait = Box::pin(tokio::time::sleep_until(prev + PACE));
                if wait.as_mut().poll(cx).is_pending() {
                    self.wait = Some(wait);
                    return std::task::Poll::Pending;
                }
                std::task::Poll::Ready(())
            }
            _ => {
                self.woke_at = Some(now);
                std::task::Poll::Ready(())
            }
        }
    }

    /// Pending while a wait started by [`Pacer::woken`] runs.
    fn poll_wait(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if let Some(wait) = self.wait.as_mut() {
            if wait.as_mut().poll(cx).is_pending() {
                return std::task::Poll::Pending;
            }
            self.wait = None;
        }
        std::task::Poll::Ready(())
    }
}

impl EventFeed {
    /// The live feed of subscription `sub` for request `r`.
    pub(super) fn new(
        caller: Caller,
        r: &pb::StreamEventsRequest,
        sub: crate::events::Subscription,
        greeting: Option<pb::StreamEventsResponse>,
        lease: Option<leases::LeaseGuard>,
        closed: tokio::sync::watch::Receiver<bool>,
        symbols: Option<Arc<crate::symbols::Symbols>>,
    ) -> Self {
        let translated = nsview::translated(&caller);
        EventFeed {
            greeting,
            translated,
            _lease: lease,
            events: tokio_stream::wrappers::BroadcastStream::new(sub.rx),
            sub: sub.guard,
            shutdown: tokio_stream::wrappers::WatchStream::new(closed),
            caller,
            pid: r.pid,
            ids: r.watchpoint_ids.iter().map(|&i| WatchId(i)).collect(),
            hits_only: r.hits_only,
            visible: authz::Visibility::default(),
            stash: None,
            dry: true,
            pacer: Pacer::default(),
            symbols,
            locating: None,
            places: (r.places_once && !translated).then(crate::wire::PlaceSet::default),
        }
    }

    /// The bytes of located hit `ev` for this stream: its places by number
    /// if it asked for places once, with every field otherwise.
    fn located(&mut self, ev: &Event, frames: &[Frame]) -> bytes::Bytes {
        match &mut self.places {
            Some(sent) => crate::wire::numbered(ev, frames, sent),
            None => crate::wire::located(ev, frames).clone(),
        }
    }

    /// Whether this subscriber gets `ev`: its filters, and its right to
    /// see the process.
    fn admits(&mut self, ev: &Event) -> bool {
        let global = matches!(ev.kind, EventKind::RecordsLost { .. });
        if self.pid != 0 && ev.kind.pid() != self.pid && !global {
            return false;
        }
        // An exec may have changed who may see the process (a setuid
        // program), an exit ends it: decided again from the next event on.
        let resets = matches!(
            &ev.kind,
            EventKind::WatchpointRemoved { .. }
                | EventKind::WatchpointResolved { .. }
                | EventKind::ProcessLost { .. }
                | EventKind::ProcessExited { .. }
        );
        if !global
            && !self
                .visible
                .admits(&self.caller, ev.kind.pid(), ev.owner.as_deref(), resets)
        {
            return false;
        }
        match &ev.kind {
            EventKind::Hit(h) => self.ids.is_empty() || self.ids.contains(&h.id),
            _ => !self.hits_only,
        }
    }

    /// `ev` as this subscriber's own message, in its numbers (a nested
    /// pid namespace's), or None if it has no number for the process.
    fn message(&self, ev: &Event) -> Option<pb::StreamEventsResponse> {
        let mut item = convert::event_to_pb(ev);
        nsview::event_out(&self.caller, &mut item).then_some(item)
    }

    /// What goes out for `ev`, which this subscriber gets; None when
    /// nothing goes out now: the subscriber has no number for its process,
    /// or its hit waits for the symbolizer (`locating` is set then).
    fn deliver(&mut self, ev: Arc<Event>) -> Option<pb::StreamEventsItem> {
        use pb::StreamEventsItem::Encoded;
        let image = match (&ev.kind, &self.symbols) {
            (EventKind::Hit(h), Some(_)) => h.image.as_ref(),
            _ => None,
        };
        let Some(image) = image else {
            // Not a hit to locate: as it is.
            return if self.translated {
                self.message(&ev).map(pb::StreamEventsItem::from)
            } else {
                Some(Encoded(crate::wire::plain(&ev).clone()))
            };
        };
        if !self.translated
            && self.places.is_none()
            && let Some(bytes) = ev.wire.located.get()
        {
            // Located already, by the journal or another subscriber.
            return Some(Encoded(bytes.clone()));
        }
        let EventKind::Hit(h) = &ev.kind else {
            unreachable!("only hits have an image")
        };
        // The common case, a hit at a known address: one lookup per
        // address, nothing to wait for.
        let cached = crate::wire::cached_frames(h);
        let waiting = if self.translated {
            let mut item = self.message(&ev)?;
            if let Some(frames) = &cached {
                convert::locate_hit(&mut item, frames);
                return Some(item.into());
            }
            Waiting::Message(Box::new(item))
        } else {
            if let Some(frames) = &cached {
                return Some(Encoded(self.located(&ev, frames)));
            }
            Waiting::Event(ev.clone())
        };
        let mut ips = Vec::with_capacity(1 + h.callchain.len());
        ips.push(h.ip);
        ips.extend_from_slice(&h.callchain);
        let symbols = self.symbols.clone().expect("a hit to locate");
        let image = image.clone();
        let fut: Locating = Box::pin(async move { symbols.frames(&image, &ips).await });
        self.locating = Some((waiting, fut));
        None
    }
}

type Received = Result<Arc<Event>, BroadcastStreamRecvError>;

impl EventFeed {
    /// The item of the hit whose frames were being located, once they are.
    fn poll_located(&mut self, cx: &mut Context<'_>) -> Poll<pb::StreamEventsItem> {
        let Some((_, fut)) = &mut self.locating else {
            return Poll::Pending;
        };
        let Poll::Ready(frames) = fut.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        Poll::Ready(match self.locating.take().expect("just polled").0 {
            Waiting::Message(mut item) => {
                convert::locate_hit(&mut item, &frames);
                pb::StreamEventsItem::Message(item)
            }
            Waiting::Event(ev) => pb::StreamEventsItem::Encoded(self.located(&ev, &frames)),
        })
    }

    /// The next event received: the one stashed, else the broadcast's;
    /// after the broadcast ran dry, the pacer is waited for first.
    fn poll_received(&mut self, cx: &mut Context<'_>) -> Poll<Option<Received>> {
        let got = match self.stash.take() {
            Some(got) => got,
            // Outside tokio's cooperative budget: a Pending here must mean
            // "nothing left", not "budget spent", or a backlog would be
            // paced every 128 events.
            None => match std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(|cx| {
                Pin::new(&mut self.events).poll_next(cx)
            })))
            .poll(cx)
            {
                Poll::Pending => {
                    self.dry = true;
                    return Poll::Pending;
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(got)) => got,
            },
        };
        if std::mem::take(&mut self.dry) && self.pacer.woken(cx).is_pending() {
            self.stash = Some(got);
            return Poll::Pending;
        }
        Poll::Ready(Some(got))
    }

    /// The item telling the subscriber it lost `n` events.
    fn dropped(&mut self, n: u64) -> pb::StreamEventsItem {
        let (first_seq, last_seq) = self.sub.state.lost(n);
        pb::StreamEventsResponse {
            seq: last_seq,
            time_ns: crate::clock::realtime_ns(),
            owner: None,
            event: Some(pb::stream_events_response::Event::Dropped(
                pb::EventsDropped {
                    count: n,
                    first_seq,
                    last_seq,
                },
            )),
        }
        .into()
    }
}

impl Stream for EventFeed {
    type Item = Result<pb::StreamEventsItem, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        // The first poll yields the current value; later ones, changes.
        while let Poll::Ready(closed) = Pin::new(&mut this.shutdown).poll_next(cx) {
            if closed != Some(false) {
                return Poll::Ready(None);
            }
        }
        if let Some(g) = this.greeting.take() {
            return Poll::Ready(Some(Ok(g.into())));
        }
        if this.locating.is_some() {
            return this.poll_located(cx).map(|item| Some(Ok(item)));
        }
        if this.pacer.poll_wait(cx).is_pending() {
            return Poll::Pending;
        }
        loop {
            let got = match this.poll_received(cx) {
                Poll::Ready(Some(got)) => got,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            match got {
                Ok(ev) => {
                    this.sub.state.received(ev.seq);
                    if !this.admits(&ev) {
                        continue;
                    }
                    if let Some(item) = this.deliver(ev) {
                        return Poll::Ready(Some(Ok(item)));
                    }
                    if this.locating.is_some() {
                        return Pin::new(this).poll_next(cx);
                    }
                }
                Err(BroadcastStreamRecvError::Lagged(n)) => {
                    return Poll::Ready(Some(Ok(this.dropped(n))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PACE, Pacer};
    use std::task::Context;

    #[tokio::test(start_paused = true)]
    async fn pacer_lets_a_wake_up_after_quiet_through_and_spaces_the_next_ones() {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut p = Pacer::default();
        assert!(p.woken(&mut cx).is_ready(), "first wake-up goes at once");
        assert!(p.poll_wait(&mut cx).is_ready());

        assert!(
            p.woken(&mut cx).is_pending(),
            "a second one within PACE waits"
        );
        assert!(p.poll_wait(&mut cx).is_pending());
        tokio::time::advance(PACE / 2).await;
        assert!(p.poll_wait(&mut cx).is_pending(), "still within the pace");
        tokio::time::advance(PACE / 2).await;
        assert!(
            p.poll_wait(&mut cx).is_ready(),
            "released when the pace ends"
        );

        tokio::time::advance(PACE / 4).await;
        assert!(
            p.woken(&mut cx).is_pending(),
            "the released batch counts as a wake-up: the next one waits again"
        );
        tokio::time::advance(PACE).await;
        assert!(p.poll_wait(&mut cx).is_ready());

        tokio::time::advance(PACE * 5).await;
        assert!(p.woken(&mut cx).is_ready(), "after a quiet spell, at once");
    }

    /// The journal as the bus sees it: each event encoded as the journal's
    /// encoder does, the records kept.
    #[derive(Default)]
    struct Journaling(std::sync::Mutex<Vec<Vec<u8>>>);

    impl crate::events::Sink for Journaling {
        fn append(&self, ev: &crate::events::Event, _: bool) {
            let mut b = Vec::new();
            crate::wire::encode_event(ev, &mut b);
            self.0.lock().unwrap().push(b);
        }
        fn burst_ended(&self) {}
    }

    /// What a subscriber gets, raw or symbolized, and the bytes prost makes
    /// of its message.
    async fn stream_and_compare(journal: bool) {
        use super::EventFeed;
        use crate::authz::Caller;
        use crate::convert;
        use crate::events::{EventBus, EventKind, Owner};
        use crate::symbols::{Image, Symbols};
        use crate::wire::tests::{hit, owner, places};
        use prost::Message;
        use std::sync::Arc;
        use tokio_stream::StreamExt;
        use wpd_proto::v1 as pb;

        let bus = EventBus::new(64);
        let sink = Arc::new(Journaling::default());
        if journal {
            assert!(bus.attach(sink.clone()).is_ok());
        }
        let symbols = Arc::new(Symbols::new());
        let feed = |raw: bool, places_once: bool| {
            let r = pb::StreamEventsRequest {
                raw,
                places_once,
                ..Default::default()
            };
            let sub = bus.subscribe(0, true);
            EventFeed::new(
                Caller::privileged(),
                &r,
                sub,
                None,
                None,
                bus.closed(),
                (!raw).then(|| symbols.clone()),
            )
        };
        let (mut raw, mut located) = (feed(true, false), feed(false, false));
        // Two streams with places once, each with its own numbers.
        let (mut numbered, mut numbered_too) = (feed(false, true), feed(false, true));
        let (mut sent, mut sent_too) = (
            wpd_proto::places::Places::new(),
            wpd_proto::places::Places::new(),
        );
        let mut seen_places = std::collections::HashSet::new();
        let mut repeats = 0;
        let mut shared_forms = 0;
        // Their bytes against the same hits with every field.
        let mut shared_bytes = (0, 0);

        // A known program with cached places; a process no longer there,
        // whose addresses go through the symbolizer.
        let image = Image::new(4242);
        let gone = Image::new(i32::MAX);
        let mut events: Vec<(EventKind, Option<Arc<Owner>>)> = Vec::new();
        let o = Arc::new(owner());
        events.push((EventKind::Hit(hit()), Some(o.clone())));
        for (n, place) in places().into_iter().enumerate() {
            let mut h = hit();
            h.ip += n as u64 * 16;
            image.insert_for_tests(h.ip - 1, Arc::new(place.clone()));
            h.image = Some(image.clone());
            events.push((EventKind::Hit(h.clone()), Some(o.clone())));
            h.callchain = vec![0x7000 + n as u64, 0x7100];
            image.insert_for_tests(0x7000 + n as u64 - 1, Arc::new(place));
            image.insert_for_tests(0x7100 - 1, Arc::new(places()[0].clone()));
            events.push((EventKind::Hit(h), None));
        }
        // Hits at places every stream has had: the first located one (its
        // place has every field) and the last two.
        let mut again = vec![events[1].clone()];
        again.extend_from_slice(&events[events.len() - 2..]);
        events.extend(again);
        let mut h = hit();
        h.image = Some(gone.clone());
        h.callchain = vec![0x9000];
        events.push((EventKind::Hit(h), Some(o.clone())));
        events.push((
            EventKind::ThreadExited {
                pid: 4242,
                tid: 4243,
            },
            Some(o.clone()),
        ));
        events.push((EventKind::RecordsLost { count: 3 }, None));
        events.push((
            EventKind::ProcessExited {
                pid: 4242,
                watchpoints: vec![crate::model::WatchId(7)],
            },
            Some(o),
        ));
        // A subscriber of the bus itself, to look at the events.
        let mut probe = bus.subscribe(0, true);
        let n = events.len();
        for (kind, owner) in events {
            bus.publish_as(kind, owner);
        }
        let published: Vec<_> = (0..n).map(|_| probe.rx.try_recv().unwrap()).collect();
        for (i, ev) in published.iter().enumerate() {
            let cached = match &ev.kind {
                EventKind::Hit(h) => crate::wire::cached_frames(h).is_some(),
                _ => false,
            };
            let (plain, loc) = (ev.wire.plain.get(), ev.wire.located.get());
            if journal {
                // Encoded by the journal's encoder and kept, once.
                let record = &sink.0.lock().unwrap()[i];
                let kept = if cached { loc } else { plain };
                assert_eq!(kept.map(|b| &b[..]), Some(&record[..]), "journaled {i}");
                assert!(if cached { plain } else { loc }.is_none(), "one form: {i}");
            } else {
                assert!(plain.is_none() && loc.is_none(), "not encoded yet: {i}");
            }
        }

        for (i, ev) in published.iter().enumerate() {
            let got_raw = raw.next().await.unwrap().unwrap();
            let got_located = located.next().await.unwrap().unwrap();
            let (pb::StreamEventsItem::Encoded(r), pb::StreamEventsItem::Encoded(l)) =
                (&got_raw, &got_located)
            else {
                panic!("a caller in the daemon's namespace gets the shared bytes: {got_raw:?}");
            };
            let want_raw = convert::event_to_pb(ev);
            assert_eq!(&r[..], want_raw.encode_to_vec().as_slice(), "raw {i}");
            let mut want = want_raw.clone();
            let image = match &ev.kind {
                EventKind::Hit(h) => h.image.as_ref().map(|image| (h, image)),
                _ => None,
            };
            if let Some((h, image)) = image {
                let mut ips = vec![h.ip];
                ips.extend_from_slice(&h.callchain);
                // Cached by now, or symbolized again the same way.
                let frames = symbols.frames(image, &ips).await;
                convert::locate_hit(&mut want, &frames);
            }
            assert_eq!(&l[..], want.encode_to_vec().as_slice(), "located {i}");
            // The bytes sent are the ones kept with the event: each form
            // made once, whoever made it.
            let plain = ev.wire.plain.get().expect("sent raw");
            assert_eq!(r.as_ptr(), plain.as_ptr(), "raw {i} shared");
            let loc = if image.is_some() {
                ev.wire.located.get().expect("sent located")
            } else {
                plain
            };
            assert_eq!(l.as_ptr(), loc.as_ptr(), "located {i} shared");

            // Places once: each place's fields go out the first time only,
            // and filled in from them the stream says what `located` says.
            let got = numbered.next().await.unwrap().unwrap();
            let got_too = numbered_too.next().await.unwrap().unwrap();
            let (pb::StreamEventsItem::Encoded(n), pb::StreamEventsItem::Encoded(n_too)) =
                (&got, &got_too)
            else {
                panic!("shared bytes: {got:?}");
            };
            let mut m = pb::StreamEventsResponse::decode(&n[..]).unwrap();
            if let Some(pb::stream_events_response::Event::Hit(h)) = &m.event {
                for loc in h.location.iter().chain(&h.backtrace) {
                    assert_ne!(loc.place_id, 0, "numbered {i}");
                    if !seen_places.insert(loc.place_id) {
                        repeats += 1;
                        let bare = pb::Location {
                            ip: loc.ip,
                            lookup_address: loc.lookup_address,
                            place_id: loc.place_id,
                            ..Default::default()
                        };
                        assert_eq!(loc, &bare, "a place sent again, event {i}");
                    }
                }
            }
            sent.fill_event(&mut m);
            let mut m_too = pb::StreamEventsResponse::decode(&n_too[..]).unwrap();
            sent_too.fill_event(&mut m_too);
            assert_eq!(m, m_too, "numbered {i}, two streams");
            if let Some(pb::stream_events_response::Event::Hit(h)) = &mut m.event {
                for loc in h.location.iter_mut().chain(&mut h.backtrace) {
                    loc.place_id = 0;
                }
            }
            assert_eq!(m, want, "numbered {i} filled in");
            if let Some(shared) = ev.wire.numbered.get() {
                // Both streams had every place: the form made once.
                assert_eq!(n.as_ptr(), shared.as_ptr(), "numbered {i} shared");
                assert_eq!(n_too.as_ptr(), shared.as_ptr(), "numbered {i} shared");
                shared_forms += 1;
                shared_bytes.0 += n.len();
                shared_bytes.1 += l.len();
            }
        }
        assert!(repeats >= 3, "{repeats} places repeated");
        assert!(
            shared_forms >= 3,
            "{shared_forms} hits of places both streams had"
        );
        assert!(
            shared_bytes.0 < shared_bytes.1,
            "numbered {} bytes against {} with every field",
            shared_bytes.0,
            shared_bytes.1
        );
        assert_eq!(sent.len(), seen_places.len());
    }

    #[tokio::test]
    async fn streamed_bytes_are_prost_s_encoding_of_the_event_message() {
        stream_and_compare(false).await;
    }

    #[tokio::test]
    async fn with_the_journal_the_streamed_bytes_are_the_journal_s() {
        stream_and_compare(true).await;
    }
}
