//! Holding a process at exec, before its first instruction
//! (kernel-facts §23). A `FAN_OPEN_EXEC_PERM` mark on a program's file
//! holds a task that execs it inside `execve`, in its open of the file;
//! there one of the hold's threads seizes it (`PTRACE_SEIZE` with
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
//! from their first instruction. The callback runs on a thread of its own,
//! so it may block (arm, read the process's memory) but may not make
//! ptrace requests of the task: the hold's thread is its tracer. Each of
//! the hold's threads (one per CPU, at most 4) holds one task at a time:
//! execs from several CPUs are armed side by side.
//!
//! The hold's process must not be the held task's parent: a tracer's
//! thread group collects its tracees' stops, and the parent's `waitpid`
//! would take the exec stop (the daemon never forks the programs it holds).
//!
//! The task is the execing process's thread-group leader, as the event
//! names it (an exec from another of its threads is held only if the
//! leader can be seized, and its stop is then the leader's).

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::fanotify::{
    EventFFlags, Fanotify, FanotifyEvent, FanotifyResponse, InitFlags, MarkFlags, MaskFlags,
    Response,
};
use nix::sys::ptrace;
use nix::sys::signal::Signal;
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

/// A running hold: its threads read the marks' events until dropped.
pub struct ExecHold {
    fan: Arc<Fanotify>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    counts: Arc<HoldCounts>,
    held: Arc<Held>,
}

/// The tasks seized now (from before their open is allowed to their
/// release).
type Held = Mutex<HashSet<Pid>>;

/// Threads reading a hold's events, each holding one exec at a time (the
/// tracer of the tasks it seizes): as many as CPUs, at most 4, so that
/// execs from several CPUs are armed side by side.
fn hold_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// Whether holds can be had here: fanotify's permission events (checked
/// once: `CAP_SYS_ADMIN`, and a kernel built with them).
pub fn available() -> Result<(), Errno> {
    static CHECKED: std::sync::OnceLock<Result<(), Errno>> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| {
        Fanotify::init(
            InitFlags::FAN_CLASS_CONTENT | InitFlags::FAN_CLOEXEC | InitFlags::FAN_NONBLOCK,
            EventFFlags::O_RDONLY | EventFFlags::O_CLOEXEC,
        )
        .map(drop)
    })
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
        let mut hold = ExecHold {
            fan,
            stop,
            threads: Vec::new(),
            counts,
            held: Arc::default(),
        };
        for _ in 0..hold_threads() {
            let (fan, stop, counts) = (hold.fan.clone(), hold.stop.clone(), hold.counts.clone());
            let (at_exec, held) = (at_exec.clone(), hold.held.clone());
            let t = std::thread::Builder::new()
                .name("wpd-exec-hold".into())
                .spawn(move || event_loop(&fan, &stop, bound, &at_exec, &counts, &held))
                .map_err(|_| Errno::EAGAIN)?;
            hold.threads.push(t);
        }
        Ok(hold)
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

    /// Holds every exec of `file` (an open file: the inode it is, whatever
    /// is at its path later).
    pub fn mark_file(&self, file: BorrowedFd<'_>) -> Result<(), Errno> {
        self.fan.mark(
            MarkFlags::FAN_MARK_ADD,
            MaskFlags::FAN_OPEN_EXEC_PERM,
            file,
            None::<&Path>,
        )
    }

    /// Holds the execs of `file` no more.
    pub fn unmark_file(&self, file: BorrowedFd<'_>) -> Result<(), Errno> {
        self.fan.mark(
            MarkFlags::FAN_MARK_REMOVE,
            MaskFlags::FAN_OPEN_EXEC_PERM,
            file,
            None::<&Path>,
        )
    }

    /// Whether `pid` is being held now (its exec under way, or stopped at
    /// it): its callback comes, or has come.
    pub fn holds(&self, pid: Pid) -> bool {
        self.held.lock().unwrap().contains(&pid)
    }

    /// What became of the execs held so far.
    pub fn counts(&self) -> &HoldCounts {
        &self.counts
    }
}

impl Drop for ExecHold {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
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
    held: &Held,
) {
    let mut helpers = Helpers::new(at_exec.clone());
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
            hold_one(fan, &ev, bound, &mut helpers, counts, held);
        }
    }
}

/// Holds the task of `ev` at its exec: seized, its open allowed, its exec
/// stop given to `at_exec`, let go.
fn hold_one(
    fan: &Fanotify,
    ev: &FanotifyEvent,
    bound: Duration,
    helpers: &mut Helpers,
    counts: &HoldCounts,
    held: &Held,
) {
    let Some(fd) = ev.fd() else {
        // The queue overflowed: nothing waits on this one.
        return;
    };
    let pid = ev.pid();
    let task = NixPid::from_raw(pid);
    let t0 = Instant::now();
    let seized = ptrace::seize(task, ptrace::Options::PTRACE_O_TRACEEXEC).is_ok();
    if seized {
        held.lock().unwrap().insert(pid);
    }
    // Whatever happens next, the open goes on.
    if let Err(e) = fan.write_response(FanotifyResponse::new(fd, Response::FAN_ALLOW)) {
        tracing::warn!(pid, "exec hold: allowing the open: {e}");
    }
    if !seized {
        counts.not_seized.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            pid,
            "exec hold: not seized (traced already, or gone): runs unheld"
        );
        return;
    }
    if !wait_for_exec(task, &helpers.deadline) {
        held.lock().unwrap().remove(&pid);
        counts.no_exec.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            pid,
            waited = ?t0.elapsed(),
            "exec hold: no exec stop within {EXEC_WAIT:?} of the open (the exec failed, the \
             task was killed, or its exec is that slow): let go"
        );
        return;
    }
    counts.held.fetch_add(1, Ordering::Relaxed);
    let stopped = t0.elapsed();
    if !helpers.arm(pid, bound) {
        counts.past_bound.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            pid,
            ?stopped,
            "exec hold: its arming took longer than {bound:?}: let go before it ended"
        );
    }
    let _ = ptrace::detach(task, None);
    held.lock().unwrap().remove(&pid);
    tracing::debug!(pid, ?stopped, held = ?t0.elapsed(), "exec held");
}

/// Waits (at most [`EXEC_WAIT`]) for seized `task` to stop at its exec:
/// true there (still stopped); else it is let go and false. Signals that
/// come first are passed on.
///
/// The wait blocks in `waitpid` (the exec's stop wakes it at once: a wait
/// that polled would take the CPU from the exec it waits for, this thread
/// being real-time). Should no exec stop come (the exec failed after its
/// open), a timer stops the task with `SIGSTOP` at the deadline: its
/// signal-delivery stop ends the wait, and the signal is discarded there
/// (a traced task's stop signal takes effect only if its tracer lets it).
fn wait_for_exec(task: NixPid, deadline: &Deadline) -> bool {
    let timer = deadline.arm(task, EXEC_WAIT);
    loop {
        match waitpid(task, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::PtraceEvent(_, _, ev)) if ev == libc::PTRACE_EVENT_EXEC => {
                // Disarmed before it is asked whether it fired, at once: a
                // signal sent after the question would reach the program.
                if timer.disarm() {
                    // The timer's signal is on its way too (an exec slower
                    // than the deadline): taken here, the task held in its
                    // stop, still before its first instruction, and never
                    // delivered (the release discards it).
                    return take_stop_signal(task);
                }
                return true;
            }
            Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) if timer.fired() => {
                // The exec failed after its open, or is stuck: let go,
                // the timer's signal discarded.
                let _ = ptrace::detach(task, None);
                return false;
            }
            Ok(WaitStatus::Stopped(_, sig)) => {
                // A signal about to be delivered: delivered.
                let _ = ptrace::cont(task, sig);
            }
            Ok(WaitStatus::PtraceEvent(..)) => {
                // A stop of another kind (a group stop): let go as it is.
                let _ = ptrace::detach(task, None);
                return false;
            }
            Err(Errno::EINTR) => {}
            // Gone (killed while held), or no longer ours.
            Ok(_) | Err(_) => return false,
        }
    }
}

/// Runs `task` on from its exec stop to the signal-delivery stop of a
/// `SIGSTOP` pending for it (other signals passed on); true there.
fn take_stop_signal(task: NixPid) -> bool {
    let mut sig = None;
    loop {
        if ptrace::cont(task, sig).is_err() {
            return false;
        }
        match waitpid(task, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => return true,
            Ok(WaitStatus::Stopped(_, other)) => sig = Some(other),
            Ok(WaitStatus::PtraceEvent(..)) => sig = None,
            _ => return false,
        }
    }
}

/// What a hold's thread keeps for its holds: the thread that runs the
/// callback (one at a time; a callback past the bound is left to finish
/// on its own and a new thread takes the next) and the deadline timer.
/// Both live as long as the hold's thread: an exec pays no thread start.
struct Helpers {
    at_exec: Arc<AtExec>,
    arm: Option<mpsc::Sender<(Pid, mpsc::Sender<()>)>>,
    deadline: Deadline,
}

impl Helpers {
    fn new(at_exec: Arc<AtExec>) -> Helpers {
        Helpers {
            at_exec,
            arm: None,
            deadline: Deadline::new(),
        }
    }

    /// Runs the callback for `pid`, waiting at most `bound`; false if it
    /// did not end by then (or could not start).
    fn arm(&mut self, pid: Pid, bound: Duration) -> bool {
        if self.arm.is_none() {
            let (tx, rx) = mpsc::channel::<(Pid, mpsc::Sender<()>)>();
            let f = self.at_exec.clone();
            let spawned = std::thread::Builder::new()
                .name("wpd-exec-arm".into())
                .spawn(move || {
                    for (pid, done) in rx {
                        f(pid);
                        let _ = done.send(());
                    }
                });
            if spawned.is_err() {
                return false;
            }
            self.arm = Some(tx);
        }
        let (done, wait) = mpsc::channel();
        let sent = self
            .arm
            .as_ref()
            .is_some_and(|tx| tx.send((pid, done)).is_ok());
        if sent && wait.recv_timeout(bound).is_ok() {
            return true;
        }
        // Stuck (or gone): it finishes on its own; the next exec gets a
        // thread of its own.
        self.arm = None;
        false
    }
}

/// The deadline of a hold's wait for an exec stop: past it, the task is
/// sent `SIGSTOP` (once), from a timer thread of the hold's thread.
struct Deadline {
    state: Arc<(Mutex<DeadlineState>, std::sync::Condvar)>,
}

#[derive(Default)]
struct DeadlineState {
    /// The task waited for, and until when; `None`: nothing armed.
    armed: Option<(NixPid, Instant)>,
    /// Its signal was sent.
    fired: bool,
    /// The hold's thread is gone.
    closed: bool,
}

/// One armed wait: disarmed on drop.
struct Armed<'d> {
    deadline: &'d Deadline,
}

impl Deadline {
    fn new() -> Deadline {
        let state: Arc<(Mutex<DeadlineState>, std::sync::Condvar)> = Arc::default();
        let s = state.clone();
        let spawned = std::thread::Builder::new()
            .name("wpd-exec-timer".into())
            .spawn(move || {
                let (lock, cv) = &*s;
                let mut g = lock.lock().unwrap();
                loop {
                    if g.closed {
                        return;
                    }
                    match g.armed {
                        None => g = cv.wait(g).unwrap(),
                        Some((task, at)) => {
                            let now = Instant::now();
                            if now < at {
                                g = cv.wait_timeout(g, at - now).unwrap().0;
                                continue;
                            }
                            g.armed = None;
                            g.fired = true;
                            let _ = nix::sys::signal::kill(task, Signal::SIGSTOP);
                        }
                    }
                }
            });
        if spawned.is_err() {
            // No timer: every wait is stopped at once (see `arm`).
            state.0.lock().unwrap().closed = true;
        }
        Deadline { state }
    }

    /// Arms the deadline for `task`, `after` from now.
    fn arm(&self, task: NixPid, after: Duration) -> Armed<'_> {
        let mut g = self.state.0.lock().unwrap();
        g.fired = false;
        if g.closed {
            // No timer thread: stop it now, so that the wait cannot block
            // forever (its exec stop, if it comes first, is taken as usual).
            g.fired = true;
            let _ = nix::sys::signal::kill(task, Signal::SIGSTOP);
        } else {
            g.armed = Some((task, Instant::now() + after));
            self.state.1.notify_all();
        }
        Armed { deadline: self }
    }
}

impl Armed<'_> {
    fn fired(&self) -> bool {
        self.deadline.state.0.lock().unwrap().fired
    }

    /// Disarms it; whether its signal was sent (the timer sends it under
    /// the same lock: none comes after this).
    fn disarm(&self) -> bool {
        let mut g = self.deadline.state.0.lock().unwrap();
        g.armed = None;
        g.fired
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.deadline.state.0.lock().unwrap().armed = None;
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        self.state.0.lock().unwrap().closed = true;
        self.state.1.notify_all();
    }
}
