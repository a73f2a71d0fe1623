//! The publishes awaiting their acknowledgement ([`Window`]), the
//! connection they went out on ([`Link`]), and why an acknowledgement ends
//! a connection's export ([`AckError`]).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio_stream::{Stream, StreamExt};

use super::{ACK_TIMEOUT, LINK_CHECK, WINDOW};

/// The connection the publishes went out on: the client reconnects by
/// itself, but an acknowledgement sent while it was away never comes.
pub(super) struct Link {
    client: async_nats::Client,
    /// Connections made before the first publish.
    connects: u64,
}

impl Link {
    pub(super) fn new(client: &async_nats::Client) -> Self {
        Link {
            client: client.clone(),
            connects: client.statistics().connects.load(Ordering::Relaxed),
        }
    }

    /// Whether the connection dropped since [`Link::new`].
    fn dropped(&self) -> bool {
        self.client.connection_state() != async_nats::connection::State::Connected
            || self.client.statistics().connects.load(Ordering::Relaxed) != self.connects
    }
}

/// The publishes awaiting their acknowledgement, oldest first, and the
/// position acknowledged in order: every event up to it is stored by the
/// server (or was a gap of the journal, counted lost).
#[derive(Debug)]
pub(super) struct Window {
    /// Sequence numbers sent, increasing, each with whether it is
    /// acknowledged yet.
    sent: VecDeque<(u64, bool)>,
    /// The position acknowledged in order.
    acked: u64,
}

/// Why an acknowledgement ended the connection's export.
#[derive(Debug, thiserror::Error)]
pub(super) enum AckError {
    /// The server refused a message (its JetStream error, or a status
    /// such as 503: no stream for the subject).
    #[error("JetStream refused event {seq}: {why}")]
    Refused { seq: u64, why: String },
    /// Nothing came for [`ACK_TIMEOUT`].
    #[error("no acknowledgement for {0:?}")]
    TimedOut(Duration),
    /// The connection dropped (and the client may have connected again):
    /// what was in flight may never be acknowledged.
    #[error("the connection dropped with {0} publishes unacknowledged")]
    Dropped(usize),
    /// The subscription ended (the connection closed).
    #[error("the acknowledgements' subscription ended")]
    Closed,
}

impl Window {
    pub(super) fn new(acked: u64) -> Self {
        Window {
            sent: VecDeque::with_capacity(WINDOW),
            acked,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.sent.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// The position acknowledged in order.
    pub(super) fn acked(&self) -> u64 {
        self.acked
    }

    /// Event `seq` was published (after every one sent before).
    pub(super) fn sent(&mut self, seq: u64) {
        debug_assert!(self.sent.back().is_none_or(|&(s, _)| s < seq));
        self.sent.push_back((seq, false));
    }

    /// Event `seq` is acknowledged; the in-order position moves past every
    /// acknowledged event at the front. An acknowledgement of an event not
    /// awaited (a repeat) changes nothing.
    fn ack(&mut self, seq: u64) {
        if let Ok(i) = self.sent.binary_search_by_key(&seq, |&(s, _)| s) {
            self.sent[i].1 = true;
        }
        while let Some(&(s, true)) = self.sent.front() {
            self.acked = s;
            self.sent.pop_front();
        }
    }

    /// Applies one message of the acknowledgements' subscription.
    fn receive(&mut self, m: &async_nats::Message, inbox: &str) -> Result<(), AckError> {
        let Some(seq) = m
            .subject
            .as_str()
            .strip_prefix(inbox)
            .and_then(|s| s.strip_prefix('.'))
            .and_then(|s| s.parse::<u64>().ok())
        else {
            return Ok(());
        };
        if let Some(status) = m.status {
            return Err(AckError::Refused {
                seq,
                why: format!("status {status}"),
            });
        }
        // `{"stream":…,"seq":…}`, with `"duplicate":true` for a repeat;
        // `{"error":{…}}` for a refusal.
        if m.payload.windows(8).any(|w| w == b"\"error\":") {
            return Err(AckError::Refused {
                seq,
                why: String::from_utf8_lossy(&m.payload).into_owned(),
            });
        }
        self.ack(seq);
        Ok(())
    }

    /// Waits for the next acknowledgement (at most [`ACK_TIMEOUT`]) and
    /// applies it with every other one already there.
    pub(super) async fn wait<S>(
        &mut self,
        acks: &mut S,
        inbox: &str,
        link: &Link,
    ) -> Result<(), AckError>
    where
        S: Stream<Item = async_nats::Message> + Unpin,
    {
        let mut waited = Duration::ZERO;
        let m = loop {
            match tokio::time::timeout(LINK_CHECK, acks.next()).await {
                Ok(m) => break m.ok_or(AckError::Closed)?,
                Err(_) if link.dropped() => return Err(AckError::Dropped(self.len())),
                Err(_) if waited >= ACK_TIMEOUT => return Err(AckError::TimedOut(ACK_TIMEOUT)),
                Err(_) => waited += LINK_CHECK,
            }
        };
        self.receive(&m, inbox)?;
        self.take_ready(acks, inbox)
    }

    /// Applies the acknowledgements already received, without waiting.
    pub(super) fn take_ready<S>(&mut self, acks: &mut S, inbox: &str) -> Result<(), AckError>
    where
        S: Stream<Item = async_nats::Message> + Unpin,
    {
        // A poll that finds nothing registers no one to wake: the next
        // `wait` polls again with the task's own waker.
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            match std::pin::Pin::new(&mut *acks).poll_next(&mut cx) {
                Poll::Ready(Some(m)) => self.receive(&m, inbox)?,
                Poll::Ready(None) => return Err(AckError::Closed),
                Poll::Pending => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack_message(subject: &str, payload: &str) -> async_nats::Message {
        async_nats::Message {
            subject: subject.into(),
            reply: None,
            payload: payload.to_string().into(),
            headers: None,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn the_window_moves_only_past_events_acknowledged_in_order() {
        let mut w = Window::new(10);
        for seq in [11, 12, 15, 16] {
            w.sent(seq);
        }
        let ok = r#"{"stream":"WPD","seq":7}"#;
        // 15 first: 11 and 12 still wait.
        w.receive(&ack_message("_INBOX.x.15", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (10, 4));
        w.receive(&ack_message("_INBOX.x.11", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (11, 3));
        // A repeat the server dropped as a duplicate is acknowledged too.
        let dup = r#"{"stream":"WPD","seq":5,"duplicate":true}"#;
        w.receive(&ack_message("_INBOX.x.12", dup), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (15, 1));
        // Another inbox's subject, or an event not awaited: nothing moves.
        w.receive(&ack_message("_INBOX.y.16", ok), "_INBOX.x")
            .unwrap();
        w.receive(&ack_message("_INBOX.x.99", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (15, 1));
        let refused = r#"{"type":"io.nats.jetstream.api.v1.pub_ack_response","error":{"code":503,"description":"insufficient resources"}}"#;
        let e = w
            .receive(&ack_message("_INBOX.x.16", refused), "_INBOX.x")
            .unwrap_err();
        assert!(matches!(e, AckError::Refused { seq: 16, .. }), "{e}");
        assert_eq!((w.acked(), w.len()), (15, 1));
        let mut no_stream = ack_message("_INBOX.x.16", "");
        no_stream.status = Some(async_nats::StatusCode::NO_RESPONDERS);
        assert!(w.receive(&no_stream, "_INBOX.x").is_err());
        w.receive(&ack_message("_INBOX.x.16", ok), "_INBOX.x")
            .unwrap();
        assert_eq!((w.acked(), w.len()), (16, 0));
    }
}
