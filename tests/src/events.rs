//! The event stream: a `StreamEvents` subscription with timeouts and bookkeeping.

use crate::*;
use std::collections::VecDeque;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::time::Instant;
use tonic::Streaming;
use wpd_proto::v1::{Hit, StreamEventsRequest, StreamEventsResponse};

/// A `StreamEvents` subscription with timeouts and bookkeeping (counts, drops, recent events
/// for error messages).
pub struct EventStream {
    stream: Streaming<StreamEventsResponse>,
    /// Events received so far.
    pub received: u64,
    /// Hits received so far.
    pub hits: u64,
    /// Sum of `EventsDropped.count` received so far.
    pub dropped: u64,
    recent: VecDeque<String>,
}

impl EventStream {
    /// Subscribes; once this returns the daemon has the subscription, so events caused after
    /// it will be delivered.
    pub async fn subscribe(client: &mut Client, req: StreamEventsRequest) -> Result<EventStream> {
        let what = format!("StreamEvents({req:?})");
        let stream = rpc_ok(&what, client.stream_events(req)).await?;
        Ok(EventStream {
            stream,
            received: 0,
            hits: 0,
            dropped: 0,
            recent: VecDeque::new(),
        })
    }

    /// Subscribes to every event of `pid`.
    pub async fn for_pid(client: &mut Client, pid: i32) -> Result<EventStream> {
        Self::subscribe(
            client,
            StreamEventsRequest {
                pid,
                watchpoint_ids: vec![],
                hits_only: false,
                raw: false,
                lease: false,
                ..Default::default()
            },
        )
        .await
    }

    /// The next event, or `None` once `deadline` has passed. Errors when the stream ends.
    pub async fn next_before(&mut self, deadline: Instant) -> Result<Option<Event>> {
        loop {
            let msg = match tokio::time::timeout_at(deadline, self.stream.message()).await {
                Err(_) => return Ok(None),
                Ok(Ok(Some(msg))) => msg,
                Ok(Ok(None)) => bail!("the event stream ended ({})", self.summary()),
                Ok(Err(s)) => bail!(
                    "the event stream failed: {} ({})",
                    status_line(&s),
                    self.summary()
                ),
            };
            self.received += 1;
            let Some(event) = msg.event else { continue };
            match &event {
                Event::Hit(_) => self.hits += 1,
                Event::Dropped(d) => self.dropped += d.count,
                _ => {}
            }
            if self.recent.len() == 8 {
                self.recent.pop_front();
            }
            let mut text = format!("{event:?}");
            text.truncate(300);
            self.recent.push_back(text);
            return Ok(Some(event));
        }
    }

    /// Feeds every event to `f` until it returns `Some` (or an error); fails after `timeout`.
    pub async fn wait_for<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&Event) -> Result<Option<T>>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(event) = self.next_before(deadline).await? else {
                bail!(
                    "timed out after {timeout:?} waiting for {what} ({})",
                    self.summary()
                );
            };
            if let Some(v) = f(&event).with_context(|| format!("while waiting for {what}"))? {
                return Ok(v);
            }
        }
    }

    /// The next `n` hits (other events are skipped); fails after `timeout`.
    pub async fn collect_hits(&mut self, n: usize, timeout: Duration) -> Result<Vec<Hit>> {
        let mut hits = Vec::with_capacity(n);
        if n == 0 {
            return Ok(hits);
        }
        self.wait_for(timeout, &format!("{n} hits"), |ev| {
            if let Event::Hit(h) = ev {
                hits.push(h.clone());
            }
            Ok((hits.len() >= n).then_some(()))
        })
        .await?;
        Ok(hits)
    }

    /// Every event that arrives during `period`.
    pub async fn drain_for(&mut self, period: Duration) -> Result<Vec<Event>> {
        let deadline = Instant::now() + period;
        let mut events = Vec::new();
        while let Some(ev) = self.next_before(deadline).await? {
            events.push(ev);
        }
        Ok(events)
    }

    /// Counts and the last few events, for error messages.
    pub fn summary(&self) -> String {
        format!(
            "{} events received ({} hits, {} reported dropped); last: [{}]",
            self.received,
            self.hits,
            self.dropped,
            self.recent.iter().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// Reads the next `n` hits of `stream` within `timeout`.
pub async fn collect_hits(
    stream: &mut EventStream,
    n: usize,
    timeout: Duration,
) -> Result<Vec<Hit>> {
    stream.collect_hits(n, timeout).await
}
