//! Leases: watchpoints and pauses that last as long as an event stream of
//! their client. A debug session opens one with its stream; however the
//! session ends (it cancels the stream, closes its connection, or its
//! process dies and the kernel closes the socket), the stream is dropped,
//! and with it the lease: its watchpoints are removed and the threads they
//! or its pauses held run again. Nothing a vanished client set keeps a
//! target stopped or armed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use crate::engine::Core;
use crate::error::WpdError;
use crate::model::{HitAction, Pid, WatchId};

/// What a lease holds.
#[derive(Debug, Default)]
struct Lease {
    /// Caller that opened it (only it may use it).
    uid: u32,
    watches: Vec<WatchId>,
    /// Processes it paused.
    paused: BTreeSet<Pid>,
}

/// The open leases.
#[derive(Debug)]
pub struct Leases {
    open: DashMap<u64, Lease>,
    next: AtomicU64,
    core: Arc<Core>,
}

/// Ends its lease when dropped (with the stream that owns it).
#[derive(Debug)]
pub struct LeaseGuard {
    leases: Arc<Leases>,
    /// The lease's id.
    pub id: u64,
}

impl Leases {
    /// No leases yet.
    pub fn new(core: Arc<Core>) -> Arc<Self> {
        Arc::new(Leases {
            open: DashMap::new(),
            // Ids are not secrets (a lease is usable by its owner only), but
            // starting at a random point keeps them from meaning anything.
            next: AtomicU64::new(
                std::hash::BuildHasher::hash_one(
                    &std::collections::hash_map::RandomState::new(),
                    0u8,
                ) >> 16
                    | 1,
            ),
            core,
        })
    }

    /// Opens a lease for `uid`.
    pub fn open(self: &Arc<Self>, uid: u32) -> LeaseGuard {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.open.insert(
            id,
            Lease {
                uid,
                ..Default::default()
            },
        );
        LeaseGuard {
            leases: self.clone(),
            id,
        }
    }

    /// Checks that `lease` is open and `uid`'s.
    pub fn check(&self, lease: u64, uid: u32) -> Result<(), WpdError> {
        match self.open.get(&lease) {
            Some(l) if l.uid == uid => Ok(()),
            _ => Err(WpdError::InvalidArgument(format!(
                "lease {lease} is not an open event stream of this caller (open one with \
                 StreamEvents lease=true, and keep the stream open)"
            ))),
        }
    }

    /// Puts watchpoint `id` under `lease`; false if the lease ended
    /// meanwhile (the caller then removes the watchpoint itself).
    pub fn add_watch(&self, lease: u64, id: WatchId) -> bool {
        match self.open.get_mut(&lease) {
            Some(mut l) => {
                l.watches.push(id);
                true
            }
            None => false,
        }
    }

    /// Notes that `lease` paused `pid`; false if the lease ended meanwhile.
    pub fn add_pause(&self, lease: u64, pid: Pid) -> bool {
        match self.open.get_mut(&lease) {
            Some(mut l) => {
                l.paused.insert(pid);
                true
            }
            None => false,
        }
    }

    /// Open leases (stats, tests).
    pub fn len(&self) -> usize {
        self.open.len()
    }

    /// True when no lease is open.
    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }
}

/// Removes what a lease held: its watchpoints, then resumes the threads of
/// each process it touched, unless a watchpoint that stops threads remains
/// there (someone else's stop). Blocking.
pub fn undo(core: &Core, watches: &[WatchId], paused: &BTreeSet<Pid>) {
    let mut pids: BTreeSet<Pid> = paused.clone();
    for &id in watches {
        // A code breakpoint holds the threads that reach it.
        if core.object_watch(id).is_some() {
            if let Ok(view) = core.remove_object_watch(id)
                && view.code.stop
            {
                pids.insert(view.spec.pid);
            }
            continue;
        }
        // An error: removed already.
        if let Ok(view) = core.remove_watchpoint(id)
            && matches!(view.spec.action, HitAction::Stop | HitAction::StopAll)
        {
            pids.insert(view.spec.pid);
        }
    }
    for pid in pids {
        let (views, _) = core.list(Some(pid));
        if views
            .iter()
            .any(|w| matches!(w.spec.action, HitAction::Stop | HitAction::StopAll))
            || core
                .object_watches()
                .iter()
                .any(|o| o.spec.pid == pid && o.code.stop)
        {
            continue;
        }
        if let Err(e) = core.resume(pid, &[]) {
            tracing::debug!(pid, "lease end: resume: {e}");
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let Some((_, lease)) = self.leases.open.remove(&self.id) else {
            return;
        };
        if lease.watches.is_empty() && lease.paused.is_empty() {
            return;
        }
        let core = self.leases.core.clone();
        let id = self.id;
        let work = move || {
            tracing::info!(
                lease = id,
                watchpoints = lease.watches.len(),
                "event stream ended: removing its leased watchpoints"
            );
            undo(&core, &lease.watches, &lease.paused);
        };
        // Dropped by the server's tasks: the undo makes syscalls, so it goes
        // to the blocking pool (a thread of its own outside a runtime).
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(work);
            }
            Err(_) => {
                std::thread::spawn(work);
            }
        }
    }
}
