//! A ptrace attachment held by the test itself (another debugger).

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};

/// A `PTRACE_SEIZE` of one thread of another process, held by this (test) process as a
/// debugger would hold it. ptrace requests must come from the thread that attached, so a
/// dedicated thread seizes, passes on every stop unchanged (the tracee never stays stopped
/// because of us) and, when asked or on drop, interrupts and detaches.
pub struct ForeignTracer {
    /// The traced thread.
    pub tid: i32,
    /// The tracing thread of this process: what the tracee's `TracerPid` shows (the kernel
    /// reports the tracer *thread*, not its process).
    pub tracer_tid: i32,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

/// How long [`ForeignTracer`] waits for its tracee's stop when detaching.
const FOREIGN_DETACH_TIMEOUT: Duration = Duration::from_secs(5);

/// What `waitpid(tid, __WALL | WNOHANG)` said about a tracee.
enum TraceeWait {
    Nothing,
    Gone,
    /// Stopped: (stop signal, ptrace event or 0).
    Stopped(libc::c_int, libc::c_int),
}

fn tracee_wait(tid: i32) -> Result<TraceeWait> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let r = unsafe { libc::waitpid(tid, &mut status, libc::__WALL | libc::WNOHANG) };
    if r == 0 {
        return Ok(TraceeWait::Nothing);
    }
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ECHILD) {
            return Ok(TraceeWait::Gone);
        }
        return Err(e).with_context(|| format!("waitpid({tid})"));
    }
    if libc::WIFSTOPPED(status) {
        Ok(TraceeWait::Stopped(libc::WSTOPSIG(status), status >> 16))
    } else {
        Ok(TraceeWait::Gone)
    }
}

fn ptrace_req(req: libc::c_uint, tid: i32, data: usize) -> std::io::Result<()> {
    // SAFETY: these requests (SEIZE, CONT, LISTEN, INTERRUPT, DETACH) take no pointer; `data`
    // is an option mask or a signal number passed as the pointer-sized argument.
    let r = unsafe {
        libc::ptrace(
            req,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn is_stop_signal(sig: libc::c_int) -> bool {
    matches!(
        sig,
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
    )
}

/// Ends a stop of our tracee: a signal-delivery-stop delivers its signal, a group-stop
/// listens (so SIGCONT still works), anything else continues.
fn pass_stop(tid: i32, sig: libc::c_int, event: libc::c_int) {
    let _ = if event == 0 {
        ptrace_req(libc::PTRACE_CONT, tid, sig as usize)
    } else if event == libc::PTRACE_EVENT_STOP && is_stop_signal(sig) {
        ptrace_req(libc::PTRACE_LISTEN, tid, 0)
    } else {
        ptrace_req(libc::PTRACE_CONT, tid, 0)
    };
}

/// Interrupts our tracee `tid` and waits for its stop. `Some(signal to pass on at detach)`
/// (0 for none: a signal-delivery-stop must not swallow its signal), or `None` if it is gone.
fn interrupt_and_wait(tid: i32) -> Result<Option<libc::c_int>> {
    match ptrace_req(libc::PTRACE_INTERRUPT, tid, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None), // gone
        r => r.with_context(|| format!("PTRACE_INTERRUPT of {tid}"))?,
    }
    let deadline = std::time::Instant::now() + FOREIGN_DETACH_TIMEOUT;
    loop {
        match tracee_wait(tid)? {
            TraceeWait::Gone => return Ok(None),
            TraceeWait::Stopped(sig, event) => return Ok(Some(if event == 0 { sig } else { 0 })),
            TraceeWait::Nothing => {}
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "thread {tid} did not stop within {FOREIGN_DETACH_TIMEOUT:?} of PTRACE_INTERRUPT"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn foreign_detach(tid: i32) -> Result<()> {
    match interrupt_and_wait(tid)? {
        None => Ok(()),
        Some(deliver) => ptrace_req(libc::PTRACE_DETACH, tid, deliver as usize)
            .with_context(|| format!("PTRACE_DETACH of {tid}")),
    }
}

impl ForeignTracer {
    /// Seizes thread `tid` (no options: it keeps running) from a new thread of this process.
    pub fn seize(tid: i32) -> Result<ForeignTracer> {
        use std::sync::mpsc::{RecvTimeoutError, channel};
        let (ready_tx, ready_rx) = channel::<std::io::Result<i32>>();
        let (stop_tx, stop_rx) = channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("foreign-tracer-{tid}"))
            .spawn(move || -> Result<()> {
                if let Err(e) = ptrace_req(libc::PTRACE_SEIZE, tid, 0) {
                    let _ = ready_tx.send(Err(e));
                    return Ok(());
                }
                // SAFETY: gettid has no preconditions.
                let _ = ready_tx.send(Ok(unsafe { libc::gettid() }));
                // Until asked to let go (or the guard is dropped).
                while let Err(RecvTimeoutError::Timeout) =
                    stop_rx.recv_timeout(Duration::from_millis(5))
                {
                    match tracee_wait(tid)? {
                        TraceeWait::Gone => return Ok(()),
                        TraceeWait::Stopped(sig, event) => pass_stop(tid, sig, event),
                        TraceeWait::Nothing => {}
                    }
                }
                foreign_detach(tid)
            })
            .context("cannot start the foreign tracer thread")?;
        let mut tracer = ForeignTracer {
            tid,
            tracer_tid: 0,
            stop: Some(stop_tx),
            thread: Some(thread),
        };
        match ready_rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(tracer_tid)) => {
                tracer.tracer_tid = tracer_tid;
                Ok(tracer)
            }
            Ok(Err(e)) => {
                tracer.stop = None;
                Err(e).with_context(|| format!("PTRACE_SEIZE of thread {tid}"))
            }
            Err(_) => bail!("the foreign tracer thread did not report within 5 s"),
        }
    }

    /// Detaches (interrupt, wait for the stop, detach) and reports how it went.
    pub fn release(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        drop(self.stop.take());
        match self.thread.take().map(|t| t.join()) {
            None => Ok(()),
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("the foreign tracer thread panicked"),
        }
    }
}

impl Drop for ForeignTracer {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            eprintln!(
                "harness: releasing the ptrace of thread {}: {e:#}",
                self.tid
            );
        }
    }
}

/// Byte offset of `u_debugreg[7]` (DR7) in the x86-64 `struct user` that `PTRACE_PEEKUSER`
/// reads (`offsetof(struct user, u_debugreg)` = 848).
const USER_DR7_OFFSET: usize = 848 + 7 * 8;

/// Reads thread `tid`'s DR7 as the kernel holds it: seizes it from a new thread of this
/// process, interrupts it, peeks DR7 and detaches (passing on a signal that arrived first).
/// The thread must not be traced by anyone else.
pub fn read_dr7(tid: i32) -> Result<u64> {
    std::thread::spawn(move || -> Result<u64> {
        ptrace_req(libc::PTRACE_SEIZE, tid, 0).with_context(|| format!("PTRACE_SEIZE of {tid}"))?;
        let Some(deliver) = interrupt_and_wait(tid)? else {
            bail!("thread {tid} exited before DR7 could be read");
        };
        // SAFETY: PEEKUSER reads a word of the stopped tracee's `struct user`; errno tells a
        // failure from a word equal to -1.
        let value = unsafe {
            *libc::__errno_location() = 0;
            libc::ptrace(
                libc::PTRACE_PEEKUSER,
                tid as libc::pid_t,
                USER_DR7_OFFSET as *mut libc::c_void,
                std::ptr::null_mut::<libc::c_void>(),
            )
        };
        let err = std::io::Error::last_os_error();
        let detached = ptrace_req(libc::PTRACE_DETACH, tid, deliver as usize);
        if value == -1 && err.raw_os_error().is_some_and(|e| e != 0) {
            return Err(err).with_context(|| format!("PTRACE_PEEKUSER(DR7) of {tid}"));
        }
        detached.with_context(|| format!("PTRACE_DETACH of {tid}"))?;
        Ok(value as u64)
    })
    .join()
    .map_err(|_| anyhow!("the DR7 reader thread panicked"))?
}
