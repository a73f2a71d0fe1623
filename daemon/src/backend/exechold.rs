//! Holding a process at exec, before its first instruction
//! (kernel-facts §23). A `FAN_OPEN_EXEC_PERM` mark on a program's file
//! holds a task that execs it inside `execve`, in its open of the file;
//! there the hold's thread seizes it (`PTRACE_SEIZE` with
//! `PTRACE_O_TRACEEXEC`) and lets the open go on (`FAN_ALLOW`), and the task
//! stops in `PTRACE_EVENT_EXEC` before the new image's first instruction.
//! The hold's callback runs there (to arm the process), for at most the
//! hold's bound, and the task is let go.
//!
//! Nothing of it reaches the task's parent: no signal is sent, and ptrace
//! stops are not reported to it. If the daemon dies meanwhile, the kernel
//! allows the pending open and the exec stop ends with its tracer: the
//! program runs on (§23.5). A task the hold cannot seize (traced already,
//! gone) is let go at once, and a task whose exec fails after the open (no
//! exec stop comes) is let go at the bound. Each is counted.
//!
//! An inode mark costs the execs of other files nothing measurable
//! (§23.4): the building block of policies that cover a program
//! (`--exe`) from its first instruction. The callback runs on a thread of
//! its own, so it may block (arm, read the process's memory) but may not
//! make ptrace requests of the task: this thread is its tracer.
//!
//! The hold's process must not be the held task's parent: a tracer's
//! thread group collects its tracees' stops, and the parent's `waitpid`
//! would take the exec stop (the daemon never forks the programs it holds).
//!
//! The task is the execing process's thread-group leader, as the event
//! names it (an exec from another of its threads is held only if the
//! leader can be seized, and its stop is then the leader's).

use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::fanotify::{
    EventFFlags, Fanotify, FanotifyEvent, FanotifyResponse, InitFlags, MarkFlags, MaskFlags,
    Response,
};
use nix::sys::ptrace;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid as NixPid;

use crate::model::Pid;

/// What the hold calls at a task's exec stop, with its pid.
pub type AtExec = dyn Fn(Pid) + Send + Sync;

/// How long the exec itself (from the open of its file to its stop) may
/// take before the task is let go unarmed.
const EXEC_WAIT: Duration = Duration::from_secs(1);

/// What became of the execs held.
#[derive(Debug, Default)]
pub struct HoldCounts {
    /// Stopped at their exec and given to the callback.
    pub held: AtomicU64,
    /// Let go before the callback returned: it took longer than the bound.
    pub past_bound: AtomicU64,
    /// Not seized (traced already, gone): let go at once.
    pub not_seized: AtomicU64,
    /// Seized, but no exec stop came in time (the exec failed after its
    /// open): let go.
    pub no_exec: AtomicU64,
}

/// A running hold: its thread reads the marks' events until dropped.
pub struct ExecHold {
    fan: Arc<Fanotify>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    counts: Arc<HoldCounts>,
}

impl ExecHold {
    /// Starts a hold whose callback `at_exec` is waited for at most
    /// `bound` per task. Needs `CAP_SYS_ADMIN` (fanotify's permission
    /// events) and the right to ptrace the tasks held.
    pub fn start(bound: Duration, at_exec: Arc<AtExec>) -> Result<ExecHold, Errno> {
        let fan = Arc::new(Fanotify::init(
            InitFlags::FAN_CLASS_CONTENT | InitFlags::FAN_CLOEXEC | InitFlags::FAN_NONBLOCK,
            EventFFlags::O_RDONLY | EventFFlags::O_CLOEXEC | EventFFlags::O_LARGEFILE,
        )?);
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(HoldCounts::default());
        let thread = {
            let (fan, stop, counts) = (fan.clone(), stop.clone(), counts.clone());
            std::thread::Builder::new()
                .name("wpd-exec-hold".into())
                .spawn(move || event_loop(&fan, &stop, bound, &at_exec, &counts))
                .map_err(|_| Errno::EAGAIN)?
        };
        Ok(ExecHold {
            fan,
            stop,
            thread: Some(thread),
            counts,
        })
    }

    /// Holds every exec of the file at `path` (its inode: a link to it, or
    /// a rename, is held too; a new file written in its place is not).
    pub fn mark(&self, path: &Path) -> Result<(), Errno> {
        self.fan.mark(
            MarkFlags::FAN_MARK_ADD,
            MaskFlags::FAN_OPEN_EXEC_PERM,
            nix::fcntl::AT_FDCWD,
            Some(path),
        )
    }

    /// Holds the execs of the file at `path` no more.
    pub fn unmark(&self, path: &Path) -> Result<(), Errno> {
        self.fan.mark(
            MarkFlags::FAN_MARK_REMOVE,
            MaskFlags::FAN_OPEN_EXEC_PERM,
            nix::fcntl::AT_FDCWD,
            Some(path),
        )
    }

    /// What became of the execs held so far.
    pub fn counts(&self) -> &HoldCounts {
        &self.counts
    }
}

impl Drop for ExecHold {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The group goes with its last fd: the kernel allows any open
        // still waiting.
    }
}

/// Reads the group's events until `stop`; each is held in turn.
fn event_loop(
    fan: &Fanotify,
    stop: &AtomicBool,
    bound: Duration,
    at_exec: &Arc<AtExec>,
    counts: &HoldCounts,
) {
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(fan.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(100u16)) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("exec hold: poll: {e}");
                return;
            }
        }
        let events = match fan.read_events() {
            Ok(v) => v,
            Err(Errno::EAGAIN | Errno::EINTR) => continue,
            Err(e) => {
                tracing::warn!("exec hold: reading events: {e}");
                return;
            }
        };
        for ev in events {
            hold_one(fan, &ev, bound, at_exec, counts);
        }
    }
}

/// Holds the task of `ev` at its exec: seized, its open allowed, its exec
/// stop given to `at_exec`, let go.
fn hold_one(
    fan: &Fanotify,
    ev: &FanotifyEvent,
    bound: Duration,
    at_exec: &Arc<AtExec>,
    counts: &HoldCounts,
) {
    let Some(fd) = ev.fd() else {
        // The queue overflowed: nothing waits on this one.
        return;
    };
    let pid = ev.pid();
    let task = NixPid::from_raw(pid);
    let seized = ptrace::seize(task, ptrace::Options::PTRACE_O_TRACEEXEC).is_ok();
    // Whatever happens next, the open goes on.
    if let Err(e) = fan.write_response(FanotifyResponse::new(fd, Response::FAN_ALLOW)) {
        tracing::warn!(pid, "exec hold: allowing the open: {e}");
    }
    if !seized {
        counts.not_seized.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if !wait_for_exec(task) {
        counts.no_exec.fetch_add(1, Ordering::Relaxed);
        return;
    }
    counts.held.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    let f = at_exec.clone();
    let spawned = std::thread::Builder::new()
        .name("wpd-exec-arm".into())
        .spawn(move || {
            f(pid);
            let _ = tx.send(());
        });
    if spawned.is_err() || rx.recv_timeout(bound).is_err() {
        counts.past_bound.fetch_add(1, Ordering::Relaxed);
    }
    let _ = ptrace::detach(task, None);
}

/// Waits (at most [`EXEC_WAIT`]) for seized `task` to stop at its exec:
/// true there (still stopped); else it is let go and false. Signals that
/// come first are passed on.
fn wait_for_exec(task: NixPid) -> bool {
    let deadline = Instant::now() + EXEC_WAIT;
    let mut nap = Duration::from_micros(20);
    loop {
        match waitpid(task, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::PtraceEvent(_, _, ev)) if ev == libc::PTRACE_EVENT_EXEC => return true,
            Ok(WaitStatus::Stopped(_, sig)) => {
                // A signal about to be delivered: delivered.
                let _ = ptrace::cont(task, sig);
            }
            Ok(WaitStatus::PtraceEvent(..)) => {
                // A stop of another kind (a group stop): let go as it is.
                let _ = ptrace::detach(task, None);
                return false;
            }
            Ok(WaitStatus::StillAlive) => {
                if Instant::now() >= deadline {
                    // The exec failed after its open, or is stuck: let go
                    // from the stop an interrupt makes.
                    if ptrace::interrupt(task).is_ok() {
                        let until = Instant::now() + Duration::from_millis(100);
                        while matches!(
                            waitpid(task, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)),
                            Ok(WaitStatus::StillAlive)
                        ) && Instant::now() < until
                        {
                            std::thread::sleep(Duration::from_micros(200));
                        }
                    }
                    let _ = ptrace::detach(task, None);
                    return false;
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
            // Gone (killed while held), or no longer ours.
            Ok(_) | Err(_) => return false,
        }
    }
}
