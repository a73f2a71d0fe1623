//! Signals the kernel delivers to watched processes, seen as they are
//! delivered: a BPF program on the `signal_deliver` tracepoint (a raw
//! tracepoint program, attached by name; it runs on every CPU) writes every
//! delivery whose action is the default one (the process dies of it, or
//! stops) and every SIGTRAP (handled or not, but for a handled perf
//! event's own, a feedback breakpoint's) into a small BPF ring; the core
//! reads it (`core/crashes.rs`).
//!
//! Why: a process wpd watches must never die of wpd, and wpd sends no
//! SIGTRAP (kernel-facts §10). Yet the kernel can deliver one to a task
//! whose breakpoints are perf events when the debug-status register (DR6)
//! it reads at the trap names no installed breakpoint, or nothing at all —
//! which a hypervisor that loses a guest's DR6 across a VM exit makes
//! happen whatever wpd does. Seen at delivery, such a trap is reported with
//! its `si_code` and what it means, instead of a target that just vanished;
//! and any other fatal signal of a watched process (a crash, a sanitizer's
//! abort) is reported the same way.
//!
//! Needs `bpf()` only: a raw tracepoint is attached by its name, with no
//! tracefs (which is not mounted on every host, nor in containers), and its
//! context is the tracepoint's arguments, `(int sig, struct kernel_siginfo
//! *info, struct k_sigaction *ka)`, read with `bpf_probe_read_kernel` at
//! offsets fixed by the architecture's ABI (kernel-facts §13).

use std::os::fd::OwnedFd;

use nix::errno::Errno;

use crate::bpf::{self, Insn, Program, RingBuf, asm, helper};
use crate::model::{Pid, Tid};

/// Ring size: signals worth reporting are rare (a crash storm of a fuzzer
/// is a few thousand a second at most).
const RING_BYTES: usize = 256 << 10;

/// Record layout written by the program (all u64, native order).
const REC_BYTES: i32 = 32;

/// `SIGTRAP`.
pub const SIGTRAP: i32 = 5;
/// `si_code` of a perf event's `SIGTRAP` (its `sigtrap` attribute).
pub const TRAP_PERF: i32 = 6;

/// A signal delivery as the program recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Process (thread group) that received it.
    pub pid: Pid,
    /// Thread that took it.
    pub tid: Tid,
    /// Signal number.
    pub signal: i32,
    /// `si_code`.
    pub code: i32,
    /// The action was the default one (`SIG_DFL`): for most signals, death.
    pub default_action: bool,
}

/// Why signal deliveries cannot be seen here.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unseen {
    /// The program could not be built.
    #[error("the signal_deliver program: {0}")]
    Program(String),
    /// `bpf()` refused.
    #[error("{what}: {errno}")]
    Refused { what: &'static str, errno: Errno },
}

/// Where the program finds what it reads: the tracepoint's arguments (u64
/// each) and the fields behind its pointers, as laid out on x86-64 (the
/// kernel's `struct kernel_siginfo` starts `si_signo, si_errno, si_code`,
/// three ints; `struct k_sigaction` starts with `struct sigaction`, whose
/// first field is `sa_handler`).
mod abi {
    /// `sig`, `info` and `ka` in the context.
    pub const ARG_SIG: i16 = 0;
    pub const ARG_INFO: i16 = 8;
    pub const ARG_KA: i16 = 16;
    /// `si_code` in `struct kernel_siginfo`.
    pub const SI_CODE: i32 = 8;
    /// `sa.sa_handler` in `struct k_sigaction`.
    pub const SA_HANDLER: i32 = 0;
}

/// The program: a delivery whose handler is `SIG_DFL`, or of SIGTRAP, is
/// written to `ring` as (pid_tgid, signal, code, handler); the group-exit
/// path's SIGKILLs, which carry no siginfo, are not.
fn program(ring: &RingBuf) -> Result<Vec<Insn>, bpf::AsmError> {
    let mut p = Program::new();
    let (keep, out) = (p.label(), p.label());
    // r6: the arguments; r7: the signal; stack -16: si_code; -24: the
    // handler (both zeroed, then read from the kernel's structures).
    p.push([
        asm::mov(6, 1),
        asm::ldx_dw(7, 6, abi::ARG_SIG),
        asm::mov_imm(1, 0),
        asm::stx_dw(10, -16, 1),
        asm::stx_dw(10, -24, 1),
        asm::mov(1, 10),
        asm::add_imm(1, -16),
        asm::mov_imm(2, 4),
        asm::ldx_dw(3, 6, abi::ARG_INFO),
        asm::add_imm(3, abi::SI_CODE),
        asm::call(helper::PROBE_READ_KERNEL),
    ]);
    // No siginfo (`SEND_SIG_NOINFO`): the kernel's group-exit path, a
    // SIGKILL each other thread takes when one calls `exit_group` or
    // `exec`, or when a signal that dumps no core ends the process
    // (kernel-facts §13). Not a crash of that thread: not recorded.
    p.jne_imm(0, 0, out);
    p.push([
        asm::mov(1, 10),
        asm::add_imm(1, -24),
        asm::mov_imm(2, 8),
        asm::ldx_dw(3, 6, abi::ARG_KA),
        asm::add_imm(3, abi::SA_HANDLER),
        asm::call(helper::PROBE_READ_KERNEL),
    ]);
    // An unreadable handler is not taken for the default action.
    p.jne_imm(0, 0, out);
    p.push([asm::ldx_dw(8, 10, -24)]);
    // A handled or ignored SIGTRAP: kept, but for a perf event's own
    // (`TRAP_PERF`) to a handler the program has: a feedback breakpoint
    // signals every store to the library that counts it (kernel-facts
    // §24), thousands a second, and a handled one is no fault. Any other
    // handled signal: not kept.
    let default = p.label();
    p.jeq_imm(8, 0, default);
    p.jne_imm(7, SIGTRAP, out);
    p.push([asm::ldx_dw(2, 10, -16)]);
    p.jeq_imm(2, TRAP_PERF, out);
    p.goto(keep);
    // The default action: kept if it ends the process. Stops, continues
    // and the ignored-by-default signals are dropped here, in the kernel:
    // a program that stops itself at every input (AFL++'s persistent
    // mode) would otherwise wake the daemon once per input, watched or
    // not.
    p.place(default);
    for sig in NOT_FATAL {
        p.jeq_imm(7, sig, out);
    }
    p.place(keep);
    p.push(asm::ld_map(1, ring.raw_fd()));
    p.push([
        asm::mov_imm(2, REC_BYTES),
        asm::mov_imm(3, 0),
        asm::call(helper::RINGBUF_RESERVE),
    ]);
    p.jeq_imm(0, 0, out);
    p.push([asm::mov(9, 0)]);
    // Ids in the daemon's namespace: a task of another one (not watched:
    // the daemon sees its watched processes in its own) records 0.
    p.push(bpf::current_pid_tgid(crate::pidns::own(), -8));
    p.push([
        asm::stx_dw(9, 0, 0),
        asm::stx_dw(9, 8, 7),
        asm::ldx_dw(1, 10, -16),
        asm::stx_dw(9, 16, 1),
        asm::stx_dw(9, 24, 8),
        asm::mov(1, 9),
        asm::mov_imm(2, 0),
        asm::call(helper::RINGBUF_SUBMIT),
    ]);
    p.place(out);
    p.push([asm::mov_imm(0, 0), asm::exit()]);
    p.build()
}

/// Decodes one record.
fn parse(body: &[u8]) -> Option<Delivery> {
    if body.len() < REC_BYTES as usize {
        return None;
    }
    let w = |i: usize| u64::from_ne_bytes(body[i * 8..i * 8 + 8].try_into().unwrap());
    let pid_tgid = w(0);
    Some(Delivery {
        pid: (pid_tgid >> 32) as Pid,
        tid: pid_tgid as u32 as Tid,
        signal: w(1) as i32,
        code: w(2) as i32,
        default_action: w(3) == 0,
    })
}

/// The running watch: the ring, and the link that keeps the program
/// attached.
#[derive(Debug)]
pub struct SignalWatch {
    ring: RingBuf,
    _link: OwnedFd,
    _prog: OwnedFd,
}

impl SignalWatch {
    /// Attaches the program to the `signal_deliver` tracepoint.
    pub fn start() -> Result<SignalWatch, Unseen> {
        let ring = RingBuf::new(RING_BYTES).map_err(|errno| Unseen::Refused {
            what: "bpf(BPF_MAP_CREATE) of a ring buffer",
            errno,
        })?;
        let insns = program(&ring).map_err(|e| Unseen::Program(e.to_string()))?;
        let prog = bpf::load_program(bpf::PROG_TYPE_RAW_TRACEPOINT, &insns).map_err(|e| {
            Unseen::Refused {
                what: "bpf(BPF_PROG_LOAD) of the signal_deliver program",
                errno: e.errno,
            }
        })?;
        let link = bpf::raw_tracepoint_open(c"signal_deliver", &prog).map_err(|errno| {
            Unseen::Refused {
                what: "bpf(BPF_RAW_TRACEPOINT_OPEN) of signal_deliver",
                errno,
            }
        })?;
        Ok(SignalWatch {
            ring,
            _link: link,
            _prog: prog,
        })
    }

    /// A duplicate of the ring's fd, to wait on: readable once a delivery
    /// is recorded in the emptied ring (the program's submit wakes readers
    /// that have caught up).
    pub fn wait_fd(&self) -> std::io::Result<OwnedFd> {
        // SAFETY: the ring's fd is open for as long as `self` is.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.ring.raw_fd()) }.try_clone_to_owned()
    }

    /// Takes every delivery recorded since the last call.
    pub fn drain(&self, out: &mut Vec<Delivery>) {
        self.ring.consume(&mut |body| {
            if let Some(d) = parse(body) {
                out.push(d);
            }
        });
    }
}

/// The signal of a signal action (`WatchpointSpec.signal`; 0: SIGABRT), or
/// why it cannot be one: it must be a signal a process can catch and that
/// is not job control, and not SIGTRAP (libFuzzer does not treat SIGTRAP as
/// a crash, and debuggers own it).
pub fn action_signal(n: i32) -> Result<i32, String> {
    let n = if n == 0 { libc::SIGABRT } else { n };
    if !(1..=64).contains(&n) {
        return Err(format!("signal {n} is not a signal number (1 to 64)"));
    }
    let why = match n {
        libc::SIGTRAP => Some(
            "debuggers own it, and libFuzzer does not count it as a crash (SIGABRT, the \
             default, is what AFL++, libFuzzer and honggfuzz all save an input for)",
        ),
        libc::SIGKILL => Some("it cannot be caught: no crash handler or sanitizer runs"),
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU | libc::SIGCONT => {
            Some("it is job control, not a crash")
        }
        libc::SIGCHLD | libc::SIGURG | libc::SIGWINCH => Some("its default action is to ignore it"),
        _ => None,
    };
    match why {
        Some(why) => Err(format!("{} cannot be the action's signal: {why}", name(n))),
        None => Ok(n),
    }
}

/// Whether `pid` can take signal `n` now: not ignored (`SigIgn`) and
/// blocked by none of its threads (their settled `SigBlk`, see
/// [`crate::procfs::settled_sigmask`]); else why not. A thread counts as
/// blocking only if it does in three looks 2 ms apart.
pub fn deliverable(pid: Pid, n: i32) -> Result<(), String> {
    let bit = 1u64 << (n - 1);
    let st = crate::procfs::Status::of(pid).ok_or_else(|| format!("no process {pid}"))?;
    if st.mask("SigIgn").is_some_and(|m| m & bit != 0) {
        return Err(format!(
            "process {pid} ignores {}: the action's signal would do nothing",
            name(n)
        ));
    }
    let mut blocking: Option<Vec<crate::model::Tid>> = None;
    for look in 0..3 {
        if look > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let now: Vec<crate::model::Tid> = crate::procfs::tasks(pid)
            .unwrap_or_default()
            .into_iter()
            .filter(|&tid| crate::procfs::settled_sigmask(pid, tid).is_some_and(|m| m & bit != 0))
            .collect();
        let b = match blocking {
            None => now,
            Some(prev) => prev.into_iter().filter(|t| now.contains(t)).collect(),
        };
        if b.is_empty() {
            return Ok(());
        }
        blocking = Some(b);
    }
    let tid = blocking.unwrap_or_default().first().copied().unwrap_or(0);
    Err(format!(
        "thread {tid} of process {pid} blocks {}: the action's signal would wait there instead \
         of ending the run at the hit",
        name(n)
    ))
}

/// The name of signal `n` (`SIGTRAP`), or `signal N`.
pub fn name(n: i32) -> String {
    nix::sys::signal::Signal::try_from(n).map_or_else(|_| format!("signal {n}"), |s| s.to_string())
}

/// Whether the default action of `sig` ends the process (terminate or core
/// dump), as opposed to ignore, stop or continue.
pub fn fatal_by_default(sig: i32) -> bool {
    !NOT_FATAL.contains(&sig)
}

/// The signals whose default action is to ignore, stop or continue.
const NOT_FATAL: [i32; 8] = [
    libc::SIGCHLD,
    libc::SIGCONT,
    libc::SIGSTOP,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
    libc::SIGURG,
    libc::SIGWINCH,
];

/// What the kernel's `si_code` says of a SIGTRAP (kernel-facts §10).
pub fn sigtrap_cause(code: i32) -> &'static str {
    match code {
        // TRAP_BRKPT from a debug exception is the kernel's reading of an
        // empty DR6 (an ICEBP, or a debug status a hypervisor lost).
        1 => {
            "TRAP_BRKPT: a breakpoint trap with no cause in the debug status register (DR6): \
             an ICEBP instruction, or a debug status lost by the hypervisor (a KVM guest before \
             Linux 6.14's fix loads a stale DR6 after some VM exits); wpd sends no SIGTRAP"
        }
        2 => "TRAP_TRACE: a single step (the trap flag was set by the program or a debugger)",
        3 => "TRAP_BRANCH: a branch trap (block stepping by a debugger)",
        4 => {
            "TRAP_HWBKPT: the debug status register (DR6) named a hardware breakpoint slot with \
             no breakpoint installed: a ptrace-set debug register, or a stale DR6 from the \
             hypervisor (KVM before Linux 6.14 could load one after a VM exit); wpd's perf \
             breakpoints are claimed by the kernel and send no signal"
        }
        6 => "TRAP_PERF: a perf event with `sigtrap` set (not one of wpd's)",
        0x80 => "SI_KERNEL: an int3 instruction in the program (a software breakpoint)",
        0 => "SI_USER: sent by a process with kill(2)",
        -6 => "SI_TKILL: sent by a process with tgkill(2)",
        _ => "an unusual si_code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode() {
        let mut b = Vec::new();
        for v in [(7u64 << 32) | 9, 5, 4, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(
            parse(&b),
            Some(Delivery {
                pid: 7,
                tid: 9,
                signal: 5,
                code: 4,
                default_action: true
            })
        );
        assert_eq!(parse(&b[..16]), None);
    }

    /// Forks a child that runs `body` and then exits 0; returns its pid
    /// once it is gone.
    fn child(body: extern "C" fn()) -> i32 {
        // SAFETY: the child only calls async-signal-safe functions
        // (setrlimit, signal, raise, _exit) before it ends.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", Errno::last());
        if pid == 0 {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: as above.
            unsafe {
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                body();
                libc::_exit(0);
            }
        }
        // A child that stops itself is continued until it is gone.
        loop {
            let mut status = 0;
            // SAFETY: waits for, and continues, our own child.
            unsafe {
                libc::waitpid(pid, &mut status, libc::WUNTRACED);
                if !libc::WIFSTOPPED(status) {
                    break;
                }
                libc::kill(pid, libc::SIGCONT);
            }
        }
        pid
    }

    extern "C" fn stops() {
        // SAFETY: raise is async-signal-safe; the parent continues the
        // child after each stop.
        unsafe {
            libc::raise(libc::SIGSTOP);
            libc::raise(libc::SIGTSTP);
        }
    }

    extern "C" fn aborts() {
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(libc::SIGABRT) };
    }

    extern "C" fn on_trap(_: libc::c_int) {}

    extern "C" fn traps_handled() {
        // SAFETY: installs a handler that does nothing, then raises.
        unsafe {
            libc::signal(libc::SIGTRAP, on_trap as *const () as libc::sighandler_t);
            libc::raise(libc::SIGTRAP);
        }
    }

    extern "C" fn handles_usr1() {
        // SAFETY: as above, for a signal the program ignores in its handler.
        unsafe {
            libc::signal(libc::SIGUSR1, on_trap as *const () as libc::sighandler_t);
            libc::raise(libc::SIGUSR1);
        }
    }

    extern "C" fn raises_term() {
        // SAFETY: raise is async-signal-safe; SIGTERM's default action ends
        // the process without a core.
        unsafe { libc::raise(libc::SIGTERM) };
    }

    extern "C" fn raises_kill() {
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGKILL) };
    }

    /// The program reads the tracepoint's arguments at the ABI's offsets:
    /// a default-action SIGABRT and a handled SIGTRAP are recorded with
    /// the signal, `si_code` (SI_TKILL: `raise` sends with tgkill) and the
    /// action; a handled SIGUSR1 is not, nor the SIGKILL that the kernel's
    /// group-exit path delivers without a siginfo when SIGTERM or SIGKILL
    /// ends a process (kernel-facts §13), nor a SIGSTOP or SIGTSTP taken at
    /// its default action (a stop, not a death).
    #[test]
    fn deliveries_are_seen_with_their_code_and_action() {
        let Ok(watch) = SignalWatch::start() else {
            // Not root, or no bpf(): the daemon says so at start.
            eprintln!("skipped: signal_deliver cannot be attached here");
            return;
        };
        let abort = child(aborts);
        let trap = child(traps_handled);
        let usr1 = child(handles_usr1);
        let term = child(raises_term);
        let kill = child(raises_kill);
        let stopped = child(stops);
        let mut seen = Vec::new();
        watch.drain(&mut seen);
        let own: Vec<Delivery> = seen
            .into_iter()
            .filter(|d| [abort, trap, usr1, term, kill, stopped].contains(&d.pid))
            .collect();
        assert_eq!(
            own,
            vec![
                Delivery {
                    pid: abort,
                    tid: abort,
                    signal: libc::SIGABRT,
                    code: libc::SI_TKILL,
                    default_action: true,
                },
                Delivery {
                    pid: trap,
                    tid: trap,
                    signal: SIGTRAP,
                    code: libc::SI_TKILL,
                    default_action: false,
                },
            ]
        );
    }
}
