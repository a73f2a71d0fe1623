//! Starting the program of a `launch` request, held before its first
//! instruction so that the daemon can attach and arm it first.
//!
//! One thread per program, the *parent thread*, does everything a parent
//! must do itself:
//! 1. fork; the child drops the adapter's real-time scheduling (`wpctl
//!    dap --priority realtime`) for the default policy, asks for `SIGKILL`
//!    at its parent thread's death (`PR_SET_PDEATHSIG`: nothing outlives an
//!    adapter that dies) and to be traced by it (`PTRACE_TRACEME`), then
//!    execs the program;
//! 2. the exec stops the child with `SIGTRAP` before the program's (or its
//!    dynamic linker's) first instruction;
//! 3. the parent detaches with `SIGSTOP` (`PTRACE_DETACH`'s signal): the
//!    child goes straight into a group-stop, still before that instruction,
//!    where any tracer (the daemon) can seize it;
//! 4. the pid is handed back; the session attaches the daemon, arms, and
//!    sends `SIGCONT` at `configurationDone`;
//! 5. the thread then waits for the program's exit and reports its code
//!    (after the program's output, read by one thread per pipe).
//!
//! ptrace requires the tracer to be the very thread that forked, and the
//! death signal follows that thread: hence one thread doing all of it
//! (kernel-facts §15).

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Program {
    /// The executable (a path; a bare name is looked up in `PATH`).
    pub program: String,
    /// Its arguments (after `argv[0]`).
    pub args: Vec<String>,
    /// Variables set (`Some`) or removed (`None`) in the adapter's
    /// environment.
    pub env: HashMap<String, Option<String>>,
    /// Its working directory (the adapter's when absent).
    pub cwd: Option<PathBuf>,
}

/// Why a program could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// fork or exec failed (no such file, not executable, bad cwd...).
    #[error("cannot start {program:?}: {why}")]
    Spawn {
        /// The program asked for.
        program: String,
        /// The system's answer.
        why: String,
    },
    /// The child did not stop at its exec as expected.
    #[error("{program:?} did not stop before its first instruction: {why}")]
    NoEntryStop {
        /// The program asked for.
        program: String,
        /// What happened instead.
        why: String,
    },
}

/// A line or chunk of the program's output.
pub type OutputSink = Box<dyn Fn(&'static str, String) + Send + Sync>;

/// The program's exit code (128 + the signal for a killed one).
pub type ExitSink = Box<dyn FnOnce(i32) + Send>;

/// Starts `p` stopped before its first instruction (group-stopped by
/// `SIGSTOP`); returns its pid. Its stdout and stderr go to `output`
/// (categories `stdout`, `stderr`); its exit code to `exited`, after its
/// output. Async: the waiting happens on the parent thread.
pub async fn start(p: Program, output: OutputSink, exited: ExitSink) -> Result<i32, LaunchError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name = p.program.clone();
    let spawned = std::thread::Builder::new()
        .name("wpd-launch".into())
        .spawn(move || parent(p, tx, output, exited));
    if let Err(e) = spawned {
        return Err(LaunchError::Spawn {
            program: name,
            why: e.to_string(),
        });
    }
    rx.await.unwrap_or_else(|_| {
        Err(LaunchError::Spawn {
            program: name,
            why: "the launching thread ended".into(),
        })
    })
}

/// Steps 1 to 3: `p` started, held in a group-stop before its first
/// instruction; its stdio captured (pipes) or inherited.
fn held_child(p: &Program, capture: bool) -> Result<std::process::Child, LaunchError> {
    let mut cmd = Command::new(&p.program);
    cmd.args(&p.args);
    if capture {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    for (k, v) in &p.env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(cwd) = &p.cwd {
        cmd.current_dir(cwd);
    }
    // SAFETY: between fork and exec, only async-signal-safe calls
    // (sched_setscheduler, prctl, ptrace) are made.
    unsafe {
        cmd.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            ptrace::traceme()?;
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| LaunchError::Spawn {
        program: p.program.clone(),
        why: e.to_string(),
    })?;
    let npid = Pid::from_raw(child.id() as i32);
    let fail = |why: String| LaunchError::NoEntryStop {
        program: p.program.clone(),
        why,
    };
    // 2: the exec's SIGTRAP stop. 3: detached into a SIGSTOP group-stop.
    let held = match waitpid(npid, None) {
        Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => {
            match ptrace::detach(npid, Signal::SIGSTOP) {
                Ok(()) => match waitpid(npid, Some(WaitPidFlag::WUNTRACED)) {
                    Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => Ok(()),
                    other => Err(fail(format!("after detaching: {other:?}"))),
                },
                Err(e) => Err(fail(format!("PTRACE_DETACH: {e}"))),
            }
        }
        other => Err(fail(format!("{other:?}"))),
    };
    if let Err(e) = held {
        let _ = nix::sys::signal::kill(npid, Signal::SIGKILL);
        let _ = waitpid(npid, None);
        return Err(e);
    }
    Ok(child)
}

/// Step 5: waits for `pid`'s end; its exit code (128 + the signal for a
/// killed one).
fn exit_code(pid: i32) -> i32 {
    loop {
        match waitpid(Pid::from_raw(pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return -1,
        }
    }
}

/// The program's side of a launch in the IDE's terminal (`runInTerminal`):
/// run by `wpctl dap --launch-helper SOCKET -- PROGRAM ARGS...` in that
/// terminal, it starts the program held (its stdio the terminal's), says
/// `pid N` on the session's socket, then `exit CODE`, and returns the code.
/// A program that cannot start is `error MESSAGE` there (and on stderr).
pub fn terminal_helper(socket: &std::path::Path, p: Program) -> i32 {
    use std::io::Write as _;
    let mut s = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "wpctl dap: cannot reach the debug session at {}: {e}",
                socket.display()
            );
            return 127;
        }
    };
    let child = match held_child(&p, false) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("wpctl dap: {e}");
            let _ = writeln!(s, "error {}", e.to_string().replace('\n', " "));
            return 127;
        }
    };
    let pid = child.id() as i32;
    if writeln!(s, "pid {pid}").is_err() {
        // The session is gone: the program never runs.
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let code = exit_code(pid);
    let _ = writeln!(s, "exit {code}");
    code
}

/// The parent thread: steps 1 to 5 of the module's documentation.
fn parent(
    p: Program,
    tx: tokio::sync::oneshot::Sender<Result<i32, LaunchError>>,
    output: OutputSink,
    exited: ExitSink,
) {
    let mut child = match held_child(&p, true) {
        Ok(c) => c,
        Err(e) => {
            let _ = tx.send(Err(e));
            return;
        }
    };
    let pid = child.id() as i32;
    let held: Result<i32, LaunchError> = Ok(pid);
    // The readers end at EOF (the program and whatever inherited its pipes
    // closed them).
    let output = std::sync::Arc::new(output);
    let (done_tx, done_rx) = std_mpsc::channel::<()>();
    let mut readers = 0;
    let pipes: [(&'static str, Option<Box<dyn Read + Send>>); 2] = [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
    ];
    for (category, pipe) in pipes {
        let Some(pipe) = pipe else { continue };
        let output = output.clone();
        let done = done_tx.clone();
        if std::thread::Builder::new()
            .name("wpd-launch-out".into())
            .spawn(move || {
                read_output(pipe, category, &output);
                let _ = done.send(());
            })
            .is_ok()
        {
            readers += 1;
        }
    }
    drop(done_tx);
    let _ = tx.send(held);
    // 5: the exit (the daemon, its tracer, has let it go by then).
    let code = exit_code(pid);
    // Its last output first; a descendant holding the pipes open does not
    // hold the exit back for long.
    for _ in 0..readers {
        if done_rx.recv_timeout(Duration::from_secs(1)).is_err() {
            break;
        }
    }
    exited(code);
}

/// Sends what `pipe` carries to `output` as it comes, in valid UTF-8 (a
/// character split between two reads waits for its end; invalid bytes
/// become U+FFFD).
fn read_output(mut pipe: Box<dyn Read + Send>, category: &'static str, output: &OutputSink) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        pending.extend_from_slice(&buf[..n]);
        let keep = incomplete_tail(&pending);
        let ready: Vec<u8> = pending.drain(..pending.len() - keep).collect();
        if !ready.is_empty() {
            output(category, String::from_utf8_lossy(&ready).into_owned());
        }
    }
    if !pending.is_empty() {
        output(category, String::from_utf8_lossy(&pending).into_owned());
    }
}

/// Bytes at the end of `b` that begin a UTF-8 character not complete yet.
fn incomplete_tail(b: &[u8]) -> usize {
    match std::str::from_utf8(b) {
        Ok(_) => 0,
        Err(e) if e.error_len().is_none() => b.len() - e.valid_up_to(),
        Err(_) => {
            // Invalid bytes earlier: only a complete-able tail is kept.
            let start = b.len().saturating_sub(3);
            (start..b.len())
                .find(|&i| {
                    std::str::from_utf8(&b[i..])
                        .is_err_and(|e| e.valid_up_to() == 0 && e.error_len().is_none())
                })
                .map_or(0, |i| b.len() - i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_between_reads_waits_for_its_end() {
        assert_eq!(incomplete_tail(b"abc"), 0);
        assert_eq!(incomplete_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_tail(&"a€".as_bytes()[..3]), 2);
        assert_eq!(incomplete_tail(b"\xffab\xe2\x82"), 2);
        assert_eq!(incomplete_tail(b"\xffab"), 0);
    }
}
