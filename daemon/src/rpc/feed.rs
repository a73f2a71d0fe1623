//! The live event feed of one `StreamEvents` subscriber: [`EventFeed`]
//! reads the event bus, keeps what this subscriber may see and asked for,
//! symbolizes hits on the way out, and is paced ([`Pacer`]) so that a busy
//! bus wakes the connection at most once per [`PACE`].

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::Status;
use wpd_proto::v1 as pb;

use super::{convert, leases, nsview};
use crate::authz::{self, Caller};
use crate::events::{Event, EventKind};
use crate::model::{Pid, WatchId};

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
    locating: Option<(pb::StreamEventsResponse, Locating)>,
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
        EventFeed {
            greeting,
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
        }
    }

    /// The message for `ev`, or None if this subscriber does not get it.
    fn pass(&mut self, ev: &Event) -> Option<pb::StreamEventsResponse> {
        let global = matches!(ev.kind, EventKind::RecordsLost { .. });
        if self.pid != 0 && ev.kind.pid() != self.pid && !global {
            return None;
        }
        if !global && !self.caller.privileged {
            let pid = ev.kind.pid();
            // An exec may have changed who may see the process (a setuid
            // program), an exit ends it: decide again from the next event
            // on.
            if matches!(
                &ev.kind,
                EventKind::WatchpointRemoved { .. }
                    | EventKind::WatchpointResolved { .. }
                    | EventKind::ProcessLost { .. }
                    | EventKind::ProcessExited { .. }
            ) {
                self.visible.forget(pid);
            }
            if !self.visible.may_see(&self.caller, pid, ev.owner.as_deref()) {
                return None;
            }
        }
        let mut item = match &ev.kind {
            EventKind::Hit(h) if !self.ids.is_empty() && !self.ids.contains(&h.id) => None,
            EventKind::Hit(_) => Some(convert::event_to_pb(ev)),
            _ if self.hits_only => None,
            _ => Some(convert::event_to_pb(ev)),
        }?;
        // In the subscriber's numbers (a nested pid namespace's), or not at
        // all.
        nsview::event_out(&self.caller, &mut item).then_some(item)
    }
}

impl Stream for EventFeed {
    type Item = Result<pb::StreamEventsResponse, Status>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let this = self.get_mut();
        // The first poll yields the current value; later ones, changes.
        while let Poll::Ready(closed) = Pin::new(&mut this.shutdown).poll_next(cx) {
            if closed != Some(false) {
                return Poll::Ready(None);
            }
        }
        if let Some(g) = this.greeting.take() {
            return Poll::Ready(Some(Ok(g)));
        }
        if let Some((_, fut)) = &mut this.locating {
            let Poll::Ready(frames) = fut.as_mut().poll(cx) else {
                return Poll::Pending;
            };
            let (mut item, _) = this.locating.take().expect("just polled");
            convert::locate_hit(&mut item, &frames);
            return Poll::Ready(Some(Ok(item)));
        }
        if this.pacer.poll_wait(cx).is_pending() {
            return Poll::Pending;
        }
        loop {
            let got =
                match this.stash.take() {
                    Some(got) => got,
                    // Outside tokio's cooperative budget: a Pending here must
                    // mean "nothing left", not "budget spent", or a backlog
                    // would be paced every 128 events.
                    None => match std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(
                        |cx| Pin::new(&mut this.events).poll_next(cx)
                    )))
                    .poll(cx)
                    {
                        Poll::Pending => {
                            this.dry = true;
                            return Poll::Pending;
                        }
                        Poll::Ready(None) => return Poll::Ready(None),
                        Poll::Ready(Some(got)) => got,
                    },
                };
            if std::mem::take(&mut this.dry) && this.pacer.woken(cx).is_pending() {
                this.stash = Some(got);
                return Poll::Pending;
            }
            match got {
                Ok(ev) => {
                    this.sub.state.received(ev.seq);
                    if let Some(mut item) = this.pass(&ev) {
                        if let (EventKind::Hit(h), Some(symbols)) = (&ev.kind, &this.symbols)
                            && let Some(image) = &h.image
                        {
                            // The common case, a hit without a call chain at a
                            // known address: one lookup, nothing allocated.
                            if h.callchain.is_empty()
                                && let Some(frame) =
                                    crate::symbols::locate::cached_frame(image, h.ip)
                            {
                                convert::locate_hit(&mut item, std::slice::from_ref(&frame));
                                return Poll::Ready(Some(Ok(item)));
                            }
                            let mut ips = Vec::with_capacity(1 + h.callchain.len());
                            ips.push(h.ip);
                            ips.extend_from_slice(&h.callchain);
                            match crate::symbols::locate::cached_frames(image, &ips) {
                                Some(frames) => convert::locate_hit(&mut item, &frames),
                                None => {
                                    let (symbols, image) = (symbols.clone(), image.clone());
                                    let fut: Locating =
                                        Box::pin(async move { symbols.frames(&image, &ips).await });
                                    this.locating = Some((item, fut));
                                    return Pin::new(this).poll_next(cx);
                                }
                            }
                        }
                        return Poll::Ready(Some(Ok(item)));
                    }
                }
                Err(BroadcastStreamRecvError::Lagged(n)) => {
                    let (first_seq, last_seq) = this.sub.state.lost(n);
                    return Poll::Ready(Some(Ok(pb::StreamEventsResponse {
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
                    })));
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
}
