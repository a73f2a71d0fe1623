//! Scheduling priority of the daemon's own threads.
//!
//! A target that keeps every CPU busy (hundreds of runnable threads, or
//! spinners) would otherwise starve the daemon: under the fair scheduler a
//! daemon thread gets about 1/N of a CPU next to N runnable target threads,
//! so ptrace stops wait, hits queue, and RPCs time out (measured: with 600
//! runnable threads of a 4,000-thread target, ListThreads did not answer
//! within 5 s). With [`Priority::Realtime`] (the default) every daemon
//! thread runs at `SCHED_FIFO` priority 1, the lowest real-time priority:
//! it runs as soon as it is woken, ahead of any normal thread. All of its
//! work is event-driven and bounded per event (a stop, a ring drain, one
//! request), and the kernel's real-time throttling
//! (`kernel.sched_rt_runtime_us`) still leaves the rest of the machine 5 %
//! even if that assumption broke. Without `CAP_SYS_NICE` the request is
//! refused and threads stay at normal priority.
//!
//! The policy is set once, on the main thread, before any other thread
//! exists ([`apply`]): Linux threads inherit their creator's scheduling
//! policy (`PTHREAD_INHERIT_SCHED`, the default), so every thread of the
//! daemon, tokio's included, gets it without being told.

/// How the daemon's threads are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Priority {
    /// `SCHED_FIFO` priority 1 for every daemon thread.
    Realtime,
    /// Normal threads; only arm passes are raised to `SCHED_FIFO` while
    /// they run.
    Normal,
}

/// Applies `p` to the calling thread and so to every thread it starts
/// afterwards (call it from `main` before any other thread exists). True if
/// the thread now runs at `SCHED_FIFO`.
pub fn apply(p: Priority) -> bool {
    p == Priority::Realtime && set_fifo()
}

fn set_fifo() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: changes only the calling thread's policy.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

fn is_fifo() -> bool {
    // SAFETY: reads the calling thread's policy.
    unsafe { libc::sched_getscheduler(0) == libc::SCHED_FIFO }
}

/// Runs the current thread at `SCHED_FIFO` priority 1 while alive, and
/// restores normal scheduling on drop if it raised it: arming thousands of
/// threads of a busy target otherwise waits behind the target's own threads
/// for CPU (kernel-facts §6: 221 ms vs ~12 µs per thread). The work done
/// under it is bounded (one arm pass). A no-op on a thread that is already
/// real-time, or without `CAP_SYS_NICE`.
pub struct Boost(bool);

impl Boost {
    /// Raises the calling thread for the guard's lifetime.
    pub fn enter() -> Self {
        Boost(!is_fifo() && set_fifo())
    }
}

impl Drop for Boost {
    fn drop(&mut self) {
        if self.0 {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: as above.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        }
    }
}
