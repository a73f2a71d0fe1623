//! The `wpd-signals` thread: signals the kernel delivers to watched
//! processes (`signals.rs`), turned into `ProcessCrashed` events — a fatal
//! signal (a crash, a sanitizer's abort) seen as it is delivered,
//! before the process is gone, and any SIGTRAP, which wpd never sends and
//! which would otherwise kill a target without a word of why
//! (kernel-facts §10).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Core;
use crate::events::{Event, EventKind};
use crate::model::{Pid, WatchId};
use crate::signals::{self, Delivery, SIGTRAP, SignalWatch};

/// How often the ring is read when nothing wakes the thread (a delivery
/// does: see [`signal_loop`]); also how soon it ends after the daemon.
const POLL: Duration = Duration::from_millis(1000);

/// Without an fd to wait on, how often the ring is read.
const POLL_BLIND: Duration = Duration::from_millis(20);

impl Core {
    /// Starts the thread, or says (once, in the log) why deliveries cannot
    /// be seen here.
    pub(super) fn start_signal_watch(self: &std::sync::Arc<Self>) {
        let watch = match SignalWatch::start() {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "{e}: fatal signals and stray SIGTRAPs of watched processes are not reported"
                );
                *self.signals_unseen.lock().unwrap() = Some(e.to_string());
                return;
            }
        };
        let wait = watch.wait_fd().ok();
        *self.signal_watch.lock().unwrap() = Some(watch);
        let core = std::sync::Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("wpd-signals".into())
            .spawn(move || signal_loop(core, wait));
    }

    /// Reports the deliveries recorded so far. Called by the thread, and
    /// when a process exits (before it is forgotten: the signal that killed
    /// it is in the ring already, and is reported before `ProcessExited`).
    pub(super) fn drain_signals(&self) {
        let mut batch = Vec::new();
        {
            let w = self.signal_watch.lock().unwrap();
            let Some(w) = w.as_ref() else {
                return;
            };
            w.drain(&mut batch);
        }
        for d in batch {
            self.delivered(d);
        }
    }

    /// One delivery: reported if its process is watched and the signal ends
    /// it or is a SIGTRAP.
    fn delivered(&self, d: Delivery) {
        let sigtrap = d.signal == SIGTRAP;
        let fatal = d.default_action && signals::fatal_by_default(d.signal);
        if !sigtrap && !fatal {
            return;
        }
        // An attached process, or a forked child covered by the watchpoints
        // it inherited (a fork server's: the one a fuzzer cares about).
        let (watchpoints, owner) = match self.procs.get(&d.pid).map(|p| p.clone()) {
            Some(proc) => (proc.watch_ids(), Some(proc.owner.clone())),
            None => match self.covered.get(&d.pid).map(|c| c.clone()) {
                // Judged on the child itself, as its hits are.
                Some(ids) => (ids, self.child_owner(d.pid)),
                None => return,
            },
        };
        let reason = if sigtrap {
            self.sigtraps.fetch_add(1, Ordering::Relaxed);
            let handled = if fatal {
                "; its default action ends the process"
            } else {
                "; the program handles it"
            };
            format!("{}{handled}", signals::sigtrap_cause(d.code))
        } else {
            format!(
                "the process dies of {} (si_code {}; its default action)",
                signals::name(d.signal),
                d.code
            )
        };
        if sigtrap {
            tracing::error!(
                pid = d.pid,
                tid = d.tid,
                code = d.code,
                reason = %reason,
                "the kernel delivered SIGTRAP to a watched process"
            );
        } else {
            tracing::info!(
                pid = d.pid,
                tid = d.tid,
                signal = d.signal,
                "watched process crashed"
            );
        }
        self.bus.publish_as(
            EventKind::ProcessCrashed {
                pid: d.pid,
                tid: d.tid,
                signal: d.signal,
                code: d.code,
                fatal,
                reason,
                last_hits: self.last_hits_in(d.pid, &watchpoints),
                watchpoints,
            },
            owner,
        );
    }
}

/// Hits of each watchpoint a crash report carries.
const CRASH_HITS: usize = 8;

impl Core {
    /// The last [`CRASH_HITS`] hits in `pid` of each of `watchpoints`, from
    /// the hits each keeps (`keep_recent`), oldest first per watchpoint.
    fn last_hits_in(&self, pid: Pid, watchpoints: &[WatchId]) -> Vec<Arc<Event>> {
        let mut out = Vec::new();
        for id in watchpoints {
            let Some(w) = self.watches.get(id).map(|w| w.clone()) else {
                continue;
            };
            let kept = w.recent.lock().unwrap();
            let mine: Vec<_> = kept
                .iter()
                .filter(|e| matches!(&e.kind, EventKind::Hit(h) if h.pid == pid))
                .cloned()
                .collect();
            out.extend(
                mine[mine.len().saturating_sub(CRASH_HITS)..]
                    .iter()
                    .cloned(),
            );
        }
        out
    }
}

fn signal_loop(core: Weak<Core>, wait: Option<std::os::fd::OwnedFd>) {
    use std::os::fd::AsRawFd;
    loop {
        match &wait {
            // Woken by the first delivery recorded after the last read: a
            // crash is reported at once, and an idle daemon does not wake
            // for nothing.
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, POLL.as_millis() as i32) };
            }
            None => std::thread::sleep(POLL_BLIND),
        }
        let Some(core) = core.upgrade() else {
            return;
        };
        if core.stop.load(Ordering::Relaxed) {
            return;
        }
        core.drain_signals();
    }
}
