//! Event fan-out: one bounded broadcast ring; every subscriber reads at its
//! own pace and a subscriber that falls behind loses the oldest events,
//! counted (tokio's `Lagged(n)`), and is told. Publishing never blocks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use crate::model::{Access, Pid, Tid, WatchId};

/// Events kept for subscribers that are behind.
pub const BUS_CAPACITY: usize = 1 << 16;

/// A watchpoint hit, as delivered.
#[derive(Debug, Clone)]
pub struct HitEvent {
    /// Watchpoint.
    pub id: WatchId,
    /// Process.
    pub pid: Pid,
    /// Thread.
    pub tid: Tid,
    /// Instruction pointer after the access.
    pub ip: u64,
    /// Watched address.
    pub addr: u64,
    /// Watched length.
    pub len: u32,
    /// Access kind.
    pub access: Access,
    /// Bytes read after the hit, or why not.
    pub value: Result<Vec<u8>, String>,
    /// Kernel time of the hit (Unix ns).
    pub time_ns: u64,
    /// When the value was read (Unix ns).
    pub value_read_ns: u64,
    /// CPU (perf backend).
    pub cpu: u32,
    /// The thread is held stopped.
    pub stopped: bool,
    /// Previous value, for only-on-change watchpoints.
    pub old_value: Option<Vec<u8>>,
    /// Backend that saw the hit.
    pub backend: crate::model::BackendKind,
}

/// What happened.
#[derive(Debug, Clone)]
pub enum EventKind {
    /// A watchpoint fired.
    Hit(HitEvent),
    /// A thread appeared.
    ThreadStarted {
        /// Process.
        pid: Pid,
        /// New thread.
        tid: Tid,
        /// Creator.
        parent: Tid,
        /// Watchpoints it carries from birth.
        watchpoints: Vec<WatchId>,
    },
    /// A thread exited.
    ThreadExited {
        /// Process.
        pid: Pid,
        /// Thread.
        tid: Tid,
    },
    /// A process exited.
    ProcessExited {
        /// Process.
        pid: Pid,
        /// Its watchpoints, now gone.
        watchpoints: Vec<WatchId>,
    },
    /// A kernel ring overflowed: records (hits, thread events) were lost
    /// before the daemon could read them.
    RecordsLost {
        /// How many.
        count: u64,
    },
    /// A watchpoint went away.
    WatchpointRemoved {
        /// Watchpoint.
        id: WatchId,
        /// Process.
        pid: Pid,
        /// Why.
        reason: &'static str,
    },
}

impl EventKind {
    /// Process the event is about.
    pub fn pid(&self) -> Pid {
        match self {
            EventKind::Hit(h) => h.pid,
            EventKind::RecordsLost { .. } => 0,
            EventKind::ThreadStarted { pid, .. }
            | EventKind::ThreadExited { pid, .. }
            | EventKind::ProcessExited { pid, .. }
            | EventKind::WatchpointRemoved { pid, .. } => *pid,
        }
    }
}

/// A published event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Daemon-wide sequence number.
    pub seq: u64,
    /// Publish time (Unix ns).
    pub time_ns: u64,
    /// What happened.
    pub kind: EventKind,
}

/// The bus.
#[derive(Debug)]
pub struct EventBus {
    tx: broadcast::Sender<Arc<Event>>,
    closed: tokio::sync::watch::Sender<bool>,
    seq: AtomicU64,
    dropped: AtomicU64,
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(BUS_CAPACITY)
    }
}

impl EventBus {
    /// A bus keeping `capacity` events for laggards.
    pub fn new(capacity: usize) -> Self {
        EventBus {
            tx: broadcast::channel(capacity).0,
            closed: tokio::sync::watch::channel(false).0,
            seq: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Publishes (never blocks; a no-op without subscribers).
    pub fn publish(&self, kind: EventKind) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let ev = Event {
            seq,
            time_ns: crate::backend::perf::realtime_ns(),
            kind,
        };
        let _ = self.tx.send(Arc::new(ev));
    }

    /// A new subscriber, starting with the next event.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Tells every stream to end (daemon shutdown).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Resolves once `close` was called.
    pub fn closed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// Current subscribers.
    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Adds to the count of events lost by slow subscribers.
    pub fn note_dropped(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// Events lost by slow subscribers, summed.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn slow_subscriber_loses_counted_events() {
        let bus = EventBus::new(4);
        let mut rx = bus.subscribe();
        for tid in 0..10 {
            bus.publish(EventKind::ThreadExited { pid: 1, tid });
        }
        match rx.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => assert_eq!(n, 6),
            other => panic!("expected lag, got {other:?}"),
        }
        let next = rx.recv().await.unwrap();
        assert!(matches!(next.kind, EventKind::ThreadExited { tid: 6, .. }));
    }
}
