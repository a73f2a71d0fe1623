//! `StreamEvents` with `after_seq` or `since_time_ns`: events read back from
//! the journal at the client's pace, then live events, with none missed and
//! none sent twice at the switch.
//!
//! The switch, in order:
//! 1. replay what the journal holds until the reader finds nothing more;
//! 2. subscribe to the bus: the subscription receives every event after
//!    `H`, the last one published at that moment;
//! 3. wait for the journal's writer to have written through `H`, and replay
//!    what is left up to `H` (events the writer never got are one gap);
//! 4. go on with the subscription, as a live `StreamEvents` does.
//!
//! Filters (process, watchpoint ids, hits only) and the caller's right to
//! see each process apply to replayed events as to live ones. A replayed
//! event goes out as the bytes the journal holds, unless the caller's
//! numbers are translated (a nested pid namespace).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;
use wpd_proto::v1 as pb;
use wpd_proto::v1::stream_events_response::Event as E;

use super::feed::EventFeed;
use crate::authz::{self, Caller};
use crate::engine::Core;
use crate::events::Subscription;
use crate::journal::{Item, Journal, Start};
use crate::model::Pid;

/// Items read from the journal per blocking read.
const BATCH: usize = 512;

/// Which replayed events a subscriber gets: the live feed's rules, on wire
/// messages.
pub(super) struct Filter {
    pub caller: Caller,
    /// Only this process (0: all).
    pub pid: Pid,
    /// Only hits of these watchpoints (empty: all).
    pub ids: Vec<u64>,
    pub hits_only: bool,
    /// Who the subscriber may see, decided once per process identity.
    visible: authz::Visibility,
}

impl Filter {
    pub fn new(caller: Caller, r: &pb::StreamEventsRequest) -> Self {
        Filter {
            caller,
            pid: r.pid,
            ids: r.watchpoint_ids.clone(),
            hits_only: r.hits_only,
            visible: authz::Visibility::default(),
        }
    }

    /// Whether the subscriber gets `item`, which is put in its numbers (a
    /// nested pid namespace's) when it does.
    pub fn pass(&mut self, item: &mut pb::StreamEventsResponse) -> bool {
        let Some(ev) = &item.event else { return false };
        let pid = match ev {
            E::Hit(h) => h.pid,
            E::ThreadStarted(e) => e.pid,
            E::ThreadExited(e) => e.pid,
            E::ProcessExited(e) => e.pid,
            E::WatchpointRemoved(e) => e.pid,
            E::ProcessLost(e) => e.pid,
            E::ProcessCrashed(e) => e.pid,
            E::BreakpointHit(e) => e.pid,
            E::WatchpointResolved(e) => e.pid,
            // Daemon-wide.
            E::RecordsLost(_) => 0,
            // Never journaled (one subscriber's own).
            E::Dropped(_) | E::Leased(_) => return false,
        };
        // Daemon-wide events are the live feed's: `RecordsLost` only.
        let global = matches!(ev, E::RecordsLost(_));
        if self.pid != 0 && pid != self.pid && !global {
            return false;
        }
        let resets = matches!(
            ev,
            E::WatchpointRemoved(_)
                | E::WatchpointResolved(_)
                | E::ProcessLost(_)
                | E::ProcessExited(_)
        );
        let owner = item.owner.as_ref().and_then(crate::convert::owner_from_pb);
        if !global
            && !self
                .visible
                .admits(&self.caller, pid, owner.as_ref(), resets)
        {
            return false;
        }
        let wanted = match ev {
            E::Hit(h) => self.ids.is_empty() || self.ids.contains(&h.watchpoint_id),
            _ => !self.hits_only,
        };
        wanted && super::nsview::event_out(&self.caller, item)
    }
}

/// The message telling a subscriber that events `first..=last` are not
/// in the journal.
fn gap(first: u64, last: u64) -> pb::StreamEventsResponse {
    pb::StreamEventsResponse {
        seq: last,
        time_ns: crate::clock::realtime_ns(),
        owner: None,
        event: Some(E::Dropped(pb::EventsDropped {
            count: last - first + 1,
            first_seq: first,
            last_seq: last,
        })),
    }
}

/// What the replay task hands the stream.
pub(super) enum Step {
    /// A replayed event (or gap).
    Item(pb::StreamEventsItem),
    /// Replay done: go on with this subscription.
    Live(Subscription),
    /// The replay failed.
    Failed(Status),
}

/// Starts the replay task of one subscriber.
pub(super) fn start(
    core: Arc<Core>,
    journal: Arc<Journal>,
    from: Start,
    mut filter: Filter,
) -> mpsc::Receiver<Step> {
    let (tx, rx) = mpsc::channel(BATCH);
    tokio::spawn(async move {
        let reader = journal.reader(from);
        // 1. What is on disk now, and what is written meanwhile.
        let reader = match pump(reader, u64::MAX, &mut filter, &tx).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(s) => {
                let _ = tx.send(Step::Failed(s)).await;
                return;
            }
        };
        // 2. Live events after `head` go to the subscription.
        let sub = match core.subscribe(filter.caller.uid, filter.caller.privileged) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Step::Failed(super::status::to_status(&e))).await;
                return;
            }
        };
        let head = sub.start_seq;
        // 3. The rest up to `head`, once the writer has it.
        journal.written_through(head).await;
        let reader = match pump(reader, head, &mut filter, &tx).await {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(s) => {
                let _ = tx.send(Step::Failed(s)).await;
                return;
            }
        };
        // Whatever up to `head` the journal does not hold is missing (a
        // replay by time that found nothing started after all of it).
        let covered = match (reader.position(), from) {
            (Some(p), _) => Some(p),
            (None, Start::AfterSeq(a)) => Some(a),
            (None, Start::SinceTime(_)) => None,
        };
        if let Some(c) = covered
            && head > c
            && tx.send(Step::Item(gap(c + 1, head).into())).await.is_err()
        {
            return;
        }
        // 4. Live.
        let _ = tx.send(Step::Live(sub)).await;
    });
    rx
}

/// Replays up to `until`: returns the reader, or None if the subscriber
/// went away.
async fn pump(
    mut reader: crate::journal::Reader,
    until: u64,
    filter: &mut Filter,
    tx: &mpsc::Sender<Step>,
) -> Result<Option<crate::journal::Reader>, Status> {
    let translated = super::nsview::translated(&filter.caller);
    loop {
        let (r, batch) = tokio::task::spawn_blocking(move || {
            let b = reader.next_batch(BATCH, until);
            (reader, b)
        })
        .await
        .map_err(|e| internal(format!("journal read task failed: {e}")))?;
        reader = r;
        let batch = batch.map_err(|e| internal(format!("reading the journal failed: {e}")))?;
        if batch.is_empty() {
            return Ok(Some(reader));
        }
        for item in batch {
            let msg = match item {
                Item::Gap { first, last } => gap(first, last).into(),
                Item::Event(rec) => {
                    match pb::StreamEventsResponse::decode(rec.payload.as_slice()) {
                        Ok(mut m) => {
                            if !filter.pass(&mut m) {
                                continue;
                            }
                            if translated {
                                m.into()
                            } else {
                                // Untouched by the filter: the bytes read.
                                pb::StreamEventsItem::Encoded(rec.payload.into())
                            }
                        }
                        Err(e) => {
                            // A record whose checksum holds but whose event
                            // does not decode: written by another version.
                            tracing::warn!(seq = rec.seq, error = %e, "journal: undecodable event");
                            gap(rec.seq, rec.seq).into()
                        }
                    }
                }
            };
            if tx.send(Step::Item(msg)).await.is_err() {
                return Ok(None);
            }
        }
    }
}

/// The stream of a replaying subscriber: the replay task's items, then the
/// live feed.
pub(super) struct ReplayFeed {
    pub greeting: Option<pb::StreamEventsResponse>,
    pub steps: mpsc::Receiver<Step>,
    /// Builds the live feed from the subscription, once the replay is done.
    pub make_live: Option<Box<dyn FnOnce(Subscription) -> EventFeed + Send>>,
    pub live: Option<EventFeed>,
    pub shutdown: tokio_stream::wrappers::WatchStream<bool>,
}

impl Stream for ReplayFeed {
    type Item = Result<pb::StreamEventsItem, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(live) = &mut this.live {
            return Pin::new(live).poll_next(cx);
        }
        while let Poll::Ready(closed) = Pin::new(&mut this.shutdown).poll_next(cx) {
            if closed != Some(false) {
                return Poll::Ready(None);
            }
        }
        if let Some(g) = this.greeting.take() {
            return Poll::Ready(Some(Ok(g.into())));
        }
        match this.steps.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Step::Item(m))) => Poll::Ready(Some(Ok(m))),
            Poll::Ready(Some(Step::Failed(s))) => Poll::Ready(Some(Err(s))),
            Poll::Ready(Some(Step::Live(sub))) => {
                let make = this.make_live.take().expect("one switch");
                this.live = Some(make(sub));
                Pin::new(this.live.as_mut().expect("just set")).poll_next(cx)
            }
        }
    }
}

/// A failure of the daemon's own, as a status with its reason.
fn internal(what: String) -> Status {
    super::status::to_status(&crate::error::WpdError::Internal(what))
}
