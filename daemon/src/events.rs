//! Event fan-out: one bounded broadcast ring; every subscriber reads at its
//! own pace and a subscriber that falls behind loses the oldest events,
//! counted (tokio's `Lagged(n)`), and is told. Publishing never blocks.
//!
//! The journal is not a subscriber: it is a [`Sink`] the bus hands every
//! event to as it numbers it (the journal encodes it there, once, into its
//! queue), so that events with no subscriber never sit in the ring.
//!
//! An event carries its wire bytes ([`Wire`]), made once by the first that
//! needs them (the journal's encoder, or the first subscriber that sends
//! them) and shared by every subscriber that sends them as they are.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::broadcast;

use crate::model::{Access, Pid, Tid, WatchId};

/// Events kept for subscribers that are behind.
pub const BUS_CAPACITY: usize = 1 << 16;

/// The note of a hit whose backtrace found no caller at all: the frame
/// pointer register held no frame at the hit.
pub const NO_FRAME_POINTER: &str = "no caller found through frame pointers: the code at the hit \
    keeps none (built with -fomit-frame-pointer, the default at -O1 and above on x86-64); the \
    functions it was inlined into are in the location";

/// A watchpoint hit, as delivered.
#[derive(Debug, Clone)]
pub struct HitEvent {
    /// Watchpoint.
    pub id: WatchId,
    /// Which of its pieces fired (0 for a watchpoint of one slot).
    pub piece: u8,
    /// Process.
    pub pid: Pid,
    /// Thread.
    pub tid: Tid,
    /// Instruction pointer after the access.
    pub ip: u64,
    /// The piece's address.
    pub addr: u64,
    /// The piece's length.
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
    /// The process's program, for symbolizing `ip` and `callchain` at
    /// delivery (None where no process is behind it, in tests).
    pub image: Option<Arc<crate::symbols::Image>>,
    /// Return addresses of the accessing thread's callers, innermost first
    /// (watchpoints asking for a backtrace).
    pub callchain: Vec<u64>,
    /// Why the call chain is shorter than asked, when known.
    pub callchain_note: Option<&'static str>,
    /// Hits of this watchpoint its rate limit dropped since the previous
    /// one reported.
    pub rate_limited_before: u64,
    /// The process's and the thread's names (`comm`), filled in by the
    /// core when the hit is published.
    pub names: Option<(Arc<str>, Arc<str>)>,
    /// The type its value reads as (its watchpoint's, when it reads one),
    /// filled in by the core when the hit is published.
    pub value_type: Option<Arc<crate::value::ValueType>>,
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
    /// The daemon can no longer watch the process and detached it.
    ProcessLost {
        /// Process.
        pid: Pid,
        /// Why.
        reason: String,
        /// Its watchpoints, now gone.
        watchpoints: Vec<WatchId>,
    },
    /// A watchpoint went away.
    WatchpointRemoved {
        /// Watchpoint.
        id: WatchId,
        /// Process.
        pid: Pid,
        /// Why.
        reason: std::borrow::Cow<'static, str>,
    },
    /// A watched process took a signal whose action ends it, or a SIGTRAP
    /// (seen at delivery, `signals.rs`).
    ProcessCrashed {
        /// Process.
        pid: Pid,
        /// Thread that took it.
        tid: Tid,
        /// Signal number.
        signal: i32,
        /// Its `si_code`.
        code: i32,
        /// The default action: the process dies of it.
        fatal: bool,
        /// What it means.
        reason: String,
        /// Its watchpoints then.
        watchpoints: Vec<WatchId>,
        /// Their last hits in this process before it, oldest first.
        last_hits: Vec<Arc<Event>>,
    },
    /// A watchpoint set by name was armed again where its name resolves now
    /// (after an exec).
    WatchpointResolved {
        /// Watchpoint (same id as before).
        id: WatchId,
        /// Process.
        pid: Pid,
        /// What the name resolved to (a data watchpoint).
        symbol: Option<crate::symbols::Resolved>,
        /// Where a pending code breakpoint's probe went.
        place: Option<std::sync::Arc<crate::model::BreakPlace>>,
        /// Why it was resolved again.
        reason: &'static str,
    },
    /// A thread reached a code breakpoint and is held until resumed.
    BreakpointHit {
        /// The breakpoint.
        id: WatchId,
        /// Process.
        pid: Pid,
        /// The thread held.
        tid: Tid,
        /// Where.
        place: Arc<crate::model::BreakPlace>,
        /// Times the breakpoint was reached, this one included.
        count: u64,
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
            | EventKind::ProcessLost { pid, .. }
            | EventKind::ProcessCrashed { pid, .. }
            | EventKind::BreakpointHit { pid, .. }
            | EventKind::WatchpointRemoved { pid, .. }
            | EventKind::WatchpointResolved { pid, .. } => *pid,
        }
    }
}

/// The process an event is about, as it was when the event happened: who
/// may see the event is decided on it (a pid alone names another process
/// once it is reused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Start time (`/proc/PID/stat` field 22): with the pid, one process.
    pub start_time: u64,
    /// Real, effective, saved uid.
    pub uids: [u32; 3],
    /// Real, effective, saved gid.
    pub gids: [u32; 3],
    /// Dumpable (not a setuid program, or one that made itself so).
    pub dumpable: bool,
}

/// A published event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Daemon-wide sequence number: consecutive, in the order subscribers
    /// receive events.
    pub seq: u64,
    /// Publish time (Unix ns).
    pub time_ns: u64,
    /// The process it is about, when the daemon knows it (None for
    /// daemon-wide events; events about a process without one are shown
    /// to privileged callers only).
    pub owner: Option<Arc<Owner>>,
    /// What happened.
    pub kind: EventKind,
    /// Its encodings, made once (see [`Wire`]).
    pub wire: Wire,
}

/// An event's `wpd.v1.StreamEventsResponse` bytes, each form made once by
/// the first that needs it (`wire/` makes them; this module only
/// carries them) and then shared: by the journal's record and every
/// subscriber that sends the event as it is.
#[derive(Debug, Clone, Default)]
pub struct Wire {
    /// Someone was subscribed when the bus numbered the event: the
    /// journal's encoder keeps what it makes for them (with nobody
    /// subscribed it encodes straight into its record and keeps nothing).
    /// A hint only: whoever needs a form that is not kept makes it.
    pub subscribed: bool,
    /// The event with no location (a hit's addresses raw).
    pub plain: OnceLock<Bytes>,
    /// A hit with its location and backtrace (a hit of a known program).
    pub located: OnceLock<Bytes>,
    /// A located hit whose places are given by number only, for the
    /// streams that asked for places once and know them all.
    pub numbered: OnceLock<Bytes>,
}

/// One subscriber's accounting, shared between its stream and the bus (so
/// that a loss counts when it happens, not when the subscriber reads again).
#[derive(Debug)]
pub struct SubState {
    /// uid of the caller that subscribed (per-caller limits and stats).
    pub uid: u32,
    /// Subscribed as a privileged caller (may use the reserve).
    pub privileged: bool,
    /// Sequence number of the last event this subscriber received or was
    /// told it lost.
    last_seq: AtomicU64,
    /// Events it was told it lost.
    told: AtomicU64,
}

impl SubState {
    /// The subscriber received event `seq`.
    pub fn received(&self, seq: u64) {
        self.last_seq.store(seq, Ordering::Relaxed);
    }

    /// The subscriber learnt it lost `n` events: their sequence numbers
    /// (first, last).
    pub fn lost(&self, n: u64) -> (u64, u64) {
        let last = self.last_seq.fetch_add(n, Ordering::Relaxed);
        self.told.fetch_add(n, Ordering::Relaxed);
        (last + 1, last + n)
    }

    /// Events lost so far: those it was told of, and those the ring has
    /// overwritten since, which it will be told of at its next read.
    fn dropped(&self, head: u64, capacity: u64) -> u64 {
        let oldest_kept = head.saturating_sub(capacity);
        self.told.load(Ordering::Relaxed)
            + oldest_kept.saturating_sub(self.last_seq.load(Ordering::Relaxed))
    }
}

/// A subscription: the receiver and its accounting.
#[derive(Debug)]
pub struct Subscription {
    /// Sequence number of the last event published before it: it receives
    /// those after.
    pub start_seq: u64,
    /// Events, from the one after the last published at subscribe time.
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// Its accounting, registered with the bus until dropped.
    pub guard: SubGuard,
}

/// A subscriber's registration with the bus; dropping it ends the
/// subscription, and what it lost stays counted.
#[derive(Debug)]
pub struct SubGuard {
    /// The accounting.
    pub state: Arc<SubState>,
    bus: Arc<Subscribers>,
}

impl Drop for SubGuard {
    fn drop(&mut self) {
        self.bus.retire(&self.state);
    }
}

/// Subscribers' accounting: live ones, and what ended ones lost, by uid.
#[derive(Debug, Default)]
struct Subscribers {
    live: Mutex<Vec<Arc<SubState>>>,
    /// How many are live (read without the lock, per event).
    count: AtomicUsize,
    retired: Mutex<std::collections::HashMap<u32, u64>>,
    /// Sequence number of the last event published.
    head: AtomicU64,
    capacity: u64,
}

impl Subscribers {
    fn retire(&self, s: &Arc<SubState>) {
        let lost = s.dropped(self.head.load(Ordering::Relaxed), self.capacity);
        self.live.lock().unwrap().retain(|x| !Arc::ptr_eq(x, s));
        self.count.fetch_sub(1, Ordering::Relaxed);
        if lost > 0 {
            *self.retired.lock().unwrap().entry(s.uid).or_default() += lost;
        }
    }
}

/// Where every published event goes as it is numbered, subscribers or not
/// (the journal). Called with the bus's order lock held, in sequence
/// order: it must not block.
pub trait Sink: Send + Sync {
    /// Takes `ev` (encodes it, or counts it lost). `in_burst`: more events
    /// of the same burst follow, and [`Sink::burst_ended`] comes after the
    /// last one (see [`EventBus::burst`]).
    fn append(&self, ev: &Event, in_burst: bool);
    /// A burst of events ended.
    fn burst_ended(&self);
}

thread_local! {
    /// This thread is publishing a burst ([`EventBus::burst`]).
    static IN_BURST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Restores the thread's burst flag (also if the burst panics).
struct BurstFlag(bool);

impl Drop for BurstFlag {
    fn drop(&mut self) {
        IN_BURST.set(self.0);
    }
}

/// The bus.
pub struct EventBus {
    tx: broadcast::Sender<Arc<Event>>,
    closed: tokio::sync::watch::Sender<bool>,
    /// Held while a sequence number is taken and its event sent, so that
    /// subscribers see consecutive numbers in order (loss accounting and
    /// `EventsDropped` ranges rely on it). Publishers are the drain thread
    /// and the tracer shards: short, rarely contended.
    order: Mutex<u64>,
    subs: Arc<Subscribers>,
    /// The journal, once attached.
    sink: std::sync::OnceLock<Arc<dyn Sink>>,
}

impl std::fmt::Debug for EventBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBus")
            .field("head", &self.subs.head.load(Ordering::Relaxed))
            .field("sink", &self.sink.get().is_some())
            .finish()
    }
}

impl Default for EventBus {
    fn default() -> Self {
        Self::new(BUS_CAPACITY)
    }
}

impl EventBus {
    /// A bus keeping `capacity` (a power of two) events for laggards.
    pub fn new(capacity: usize) -> Self {
        EventBus {
            tx: broadcast::channel(capacity).0,
            closed: tokio::sync::watch::channel(false).0,
            order: Mutex::new(0),
            subs: Arc::new(Subscribers {
                capacity: capacity.next_power_of_two() as u64,
                ..Subscribers::default()
            }),
            sink: std::sync::OnceLock::new(),
        }
    }

    /// Publishes an event without a known process (never blocks; a no-op
    /// without subscribers).
    pub fn publish(&self, kind: EventKind) {
        self.publish_as(kind, None);
    }

    /// Publishes `kind` about the process `owner` (never blocks; a no-op
    /// without subscribers and journal).
    pub fn publish_as(&self, kind: EventKind, owner: Option<Arc<Owner>>) {
        if self.tx.receiver_count() == 0 && self.sink.get().is_none() {
            return;
        }
        self.publish_kept(kind, owner);
    }

    /// Publishes `kind` even with no subscriber (it gets its sequence
    /// number) and returns it, for the caller to keep.
    pub fn publish_kept(&self, kind: EventKind, owner: Option<Arc<Owner>>) -> Arc<Event> {
        let mut seq = self.order.lock().unwrap();
        *seq += 1;
        let ev = Event {
            seq: *seq,
            time_ns: crate::clock::realtime_ns(),
            owner,
            kind,
            wire: Wire {
                subscribed: self.subs.count.load(Ordering::Relaxed) > 0,
                ..Wire::default()
            },
        };
        if let Some(sink) = self.sink.get() {
            sink.append(&ev, IN_BURST.get());
        }
        let ev = Arc::new(ev);
        let _ = self.tx.send(ev.clone());
        self.subs.head.store(*seq, Ordering::Relaxed);
        ev
    }

    /// Runs `f`, whose events from this thread are one burst: the sink
    /// (the journal's writer) is woken once, at its end, instead of at its
    /// first event (the perf drain publishes the hits of one pass over its
    /// rings as one burst).
    pub fn burst<R>(&self, f: impl FnOnce() -> R) -> R {
        let outer = IN_BURST.replace(true);
        let r = {
            let _restore = BurstFlag(outer);
            f()
        };
        if !outer && let Some(sink) = self.sink.get() {
            sink.burst_ended();
        }
        r
    }

    /// Numbers the next event `seq + 1` (a journal recovered up to `seq`).
    /// Call before anything is published.
    pub fn continue_after(&self, seq: u64) {
        let mut s = self.order.lock().unwrap();
        *s = (*s).max(seq);
        self.subs.head.store(*s, Ordering::Relaxed);
    }

    /// Sequence number of the last event published.
    pub fn head(&self) -> u64 {
        *self.order.lock().unwrap()
    }

    /// Hands every event from the next one on to `sink` (the journal),
    /// outside the subscribers' accounting. One sink per bus: a second
    /// is refused (returned).
    pub fn attach(&self, sink: Arc<dyn Sink>) -> Result<(), Arc<dyn Sink>> {
        let _seq = self.order.lock().unwrap();
        self.sink.set(sink)
    }

    /// A new subscriber of `uid`, starting with the next event.
    pub fn subscribe(&self, uid: u32, privileged: bool) -> Subscription {
        let seq = self.order.lock().unwrap();
        let rx = self.tx.subscribe();
        let state = Arc::new(SubState {
            uid,
            privileged,
            last_seq: AtomicU64::new(*seq),
            told: AtomicU64::new(0),
        });
        self.subs.live.lock().unwrap().push(state.clone());
        self.subs.count.fetch_add(1, Ordering::Relaxed);
        Subscription {
            start_seq: *seq,
            rx,
            guard: SubGuard {
                state,
                bus: self.subs.clone(),
            },
        }
    }

    /// Tells every stream to end (daemon shutdown).
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Resolves once `close` was called.
    pub fn closed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closed.subscribe()
    }

    /// Current subscribers (of `uid` only, when given).
    pub fn subscribers(&self, uid: Option<u32>) -> usize {
        self.subs
            .live
            .lock()
            .unwrap()
            .iter()
            .filter(|s| uid.is_none_or(|u| s.uid == u))
            .count()
    }

    /// Events lost by subscribers (of `uid` only, when given), summed: as
    /// soon as the ring overwrote them, whether or not the subscriber has
    /// read since.
    pub fn dropped(&self, uid: Option<u32>) -> u64 {
        let head = self.subs.head.load(Ordering::Relaxed);
        let cap = self.subs.capacity;
        let live: u64 = self
            .subs
            .live
            .lock()
            .unwrap()
            .iter()
            .filter(|s| uid.is_none_or(|u| s.uid == u))
            .map(|s| s.dropped(head, cap))
            .sum();
        let retired: u64 = self
            .subs
            .retired
            .lock()
            .unwrap()
            .iter()
            .filter(|(u, _)| uid.is_none_or(|x| **u == x))
            .map(|(_, n)| n)
            .sum();
        live + retired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(tid: i32) -> EventKind {
        EventKind::ThreadExited { pid: 1, tid }
    }

    #[tokio::test]
    async fn slow_subscriber_loses_counted_events() {
        let bus = EventBus::new(4);
        let mut sub = bus.subscribe(1000, false);
        for tid in 0..10 {
            bus.publish(exit(tid));
        }
        // Counted before the subscriber reads: 10 published, 4 kept.
        assert_eq!(bus.dropped(None), 6);
        assert_eq!(bus.dropped(Some(1000)), 6);
        assert_eq!(bus.dropped(Some(0)), 0);
        match sub.rx.recv().await {
            Err(broadcast::error::RecvError::Lagged(n)) => {
                assert_eq!(n, 6);
                assert_eq!(sub.guard.state.lost(n), (1, 6), "seqs 1..=6 were lost");
            }
            other => panic!("expected lag, got {other:?}"),
        }
        // Told now: still 6, not 12.
        assert_eq!(bus.dropped(None), 6);
        let next = sub.rx.recv().await.unwrap();
        assert_eq!(next.seq, 7);
        sub.guard.state.received(next.seq);
        assert!(matches!(next.kind, EventKind::ThreadExited { tid: 6, .. }));
    }

    #[tokio::test]
    async fn a_subscriber_that_never_reads_and_leaves_keeps_its_losses_counted() {
        let bus = EventBus::new(4);
        let reader = bus.subscribe(0, true);
        let idle = bus.subscribe(1000, false);
        for tid in 0..20 {
            bus.publish(exit(tid));
        }
        assert_eq!(bus.subscribers(None), 2);
        assert_eq!(bus.subscribers(Some(1000)), 1);
        assert_eq!(bus.dropped(Some(1000)), 16);
        drop(idle);
        assert_eq!(bus.subscribers(None), 1);
        assert_eq!(bus.dropped(Some(1000)), 16, "kept after it left");
        assert_eq!(bus.dropped(None), 32, "the root reader lost as many");
        drop(reader);
        assert_eq!(bus.dropped(None), 32);
    }

    #[derive(Default)]
    struct Recorder(Mutex<Vec<String>>);

    impl Sink for Recorder {
        fn append(&self, ev: &Event, in_burst: bool) {
            self.0
                .lock()
                .unwrap()
                .push(format!("{} {in_burst}", ev.seq));
        }
        fn burst_ended(&self) {
            self.0.lock().unwrap().push("end".into());
        }
    }

    #[test]
    fn the_sink_gets_every_event_and_hears_of_a_burst_once_at_its_end() {
        let bus = EventBus::new(4);
        let sink = Arc::new(Recorder::default());
        assert!(bus.attach(sink.clone()).is_ok());
        assert!(bus.attach(sink.clone()).is_err(), "one sink per bus");
        // No subscriber: published all the same, for the sink.
        bus.publish(exit(1));
        bus.burst(|| {
            bus.publish(exit(2));
            bus.burst(|| bus.publish(exit(3)));
            bus.publish(exit(4));
        });
        bus.publish(exit(5));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            bus.burst(|| panic!("a burst that fails"))
        }));
        assert!(r.is_err());
        bus.publish(exit(6));
        assert_eq!(
            *sink.0.lock().unwrap(),
            [
                "1 false", "2 true", "3 true", "4 true", "end", "5 false", "6 false"
            ]
        );
    }

    #[test]
    fn sequence_numbers_are_consecutive_in_send_order() {
        let bus = Arc::new(EventBus::new(1 << 16));
        let mut sub = bus.subscribe(0, true);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let bus = bus.clone();
                std::thread::spawn(move || {
                    for i in 0..2_000 {
                        bus.publish(exit(t * 10_000 + i));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for want in 1..=8_000u64 {
            assert_eq!(sub.rx.try_recv().unwrap().seq, want);
        }
    }
}
