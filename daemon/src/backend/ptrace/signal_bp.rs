//! Stops that a dead tracer cannot turn into a crash (kernel-facts §2b).
//!
//! A watchpoint of the ptrace backend is, where the kernel allows it, a
//! per-thread `perf_event_open` breakpoint (not a debug register poked
//! through ptrace) whose BPF program sends the hitting thread a signal the
//! process neither catches nor blocks and whose default action is to
//! ignore it (SIGURG or SIGWINCH). The tracer sees the signal at its
//! signal-delivery stop, reads which of the thread's breakpoints counted
//! the hit, and swallows it, or holds the thread there: the stop
//! semantics of the debug-register way, with nothing that outlives the
//! daemon. If the daemon dies, however it dies, the kernel closes its fds
//! (the breakpoints are gone) and detaches its tracees: a signal in flight
//! is delivered and ignored, a thread held at a hit runs on.
//!
//! Needs `bpf()` (CAP_BPF and CAP_PERFMON, or root) and a signal that fits
//! the process; otherwise the process gets debug registers, as before.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use dashmap::DashMap;
use nix::errno::Errno;
use nix::sys::signal::Signal;

use crate::backend::fds::{CountedFd, FdBudget};
use crate::model::{Access, Pid, Tid, WatchLen};
use crate::procfs;

/// Signals tried, in order: default action "ignore", rarely used by
/// programs (SIGURG is sent for out-of-band socket data and used by the Go
/// runtime, which catches it: then SIGWINCH is taken).
pub const CANDIDATES: [Signal; 2] = [Signal::SIGURG, Signal::SIGWINCH];

/// How one process's watchpoints stop its threads.
#[derive(Debug)]
pub struct SignalMode {
    /// The signal its breakpoints send.
    pub signal: Signal,
    /// The BPF program sending it (shared by every breakpoint).
    prog: Arc<OwnedFd>,
    /// Once the process has a disarming probe: its breakpoints' program
    /// sends nothing for an address its freed objects had.
    mute: OnceLock<Mute>,
    /// The daemon's fd budget: every breakpoint, probe, program and map
    /// opened for the process's watchpoints and code events is counted.
    pub fds: Arc<FdBudget>,
}

/// Stores into freed objects muted in the kernel: a disarming probe's
/// program (`code`) puts the freed object's watched addresses in `dead`,
/// and the process's breakpoints' program sends no signal for a
/// breakpoint whose address is there, until the daemon has closed the
/// object's breakpoints and taken the addresses out.
#[derive(Debug)]
pub struct Mute {
    /// The addresses muted (value: 1).
    pub dead: crate::bpf::U64Map,
    prog: OwnedFd,
}

/// Most addresses muted at once in one process: the freed objects whose
/// breakpoints are not closed yet (within a sweep), a few per object. The
/// map takes memory as entries are added (16 bytes a bucket up front, 64
/// KiB at this size: kernel-facts §21); a full map mutes no more, and the
/// daemon then drops such hits itself (it reads the freeing calls' records
/// before a stop's hits).
const DEAD_MAX: u32 = 4096;

impl SignalMode {
    /// The process's muting (made the first time).
    pub fn mute(&self) -> Result<&Mute, Errno> {
        if let Some(m) = self.mute.get() {
            return Ok(m);
        }
        let dead = crate::bpf::U64Map::new(DEAD_MAX, 1)?;
        let prog = load_muting(self.signal as i32, dead.raw_fd())?;
        let _ = self.mute.set(Mute { dead, prog });
        Ok(self.mute.get().expect("set just now"))
    }

    /// Takes `addrs` out of the muted addresses (their breakpoints closed,
    /// or about to be opened for a new object).
    pub fn unmute(&self, addrs: &[u64]) {
        if let Some(m) = self.mute.get() {
            for &a in addrs {
                m.dead.remove(a);
            }
        }
    }

    /// Whether a breakpoint at `addr` is muted now.
    pub fn muted(&self, addr: u64) -> bool {
        self.mute.get().is_some_and(|m| m.dead.get(addr).is_some())
    }
}

/// Processes whose tracees use signal stops (set at attach, before the
/// first seize; read when a tracee is created).
static MODES: LazyLock<DashMap<Pid, Arc<SignalMode>>> = LazyLock::new(DashMap::new);

/// One loaded program per signal.
static PROGS: LazyLock<Mutex<HashMap<i32, Arc<OwnedFd>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Why a process does not get signal stops.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoSignalStops {
    /// `bpf()` refused (no CAP_BPF/CAP_PERFMON, or disabled).
    #[error("bpf() refused: {}", .0.desc())]
    Bpf(Errno),
    /// Every candidate signal is caught, ignored or blocked by the process
    /// (its masks: caught, ignored, blocked by some thread).
    #[error(
        "the process catches, ignores or blocks SIGURG and SIGWINCH (caught {caught:#x}, \
         ignored {ignored:#x}, blocked {blocked:#x})"
    )]
    NoSignal {
        /// Signals it catches (`SigCgt`).
        caught: u64,
        /// Signals it ignores (`SigIgn`).
        ignored: u64,
        /// Signals some thread blocks (`SigBlk`).
        blocked: u64,
    },
    /// Turned off (`--ptrace-stops debug-registers`).
    #[error("turned off")]
    Off,
}

/// Which stops processes get (`wpd --ptrace-stops`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Signal stops where possible, else debug registers.
    Auto,
    /// Debug registers always.
    DebugRegisters,
}

/// Chooses signal stops for `pid` if possible and registers them; what
/// they open is counted in `fds`.
pub fn enable(pid: Pid, fds: Arc<FdBudget>) -> Result<Signal, NoSignalStops> {
    let signal = choose_signal(pid)?;
    let prog = program(signal).map_err(NoSignalStops::Bpf)?;
    MODES.insert(
        pid,
        Arc::new(SignalMode {
            signal,
            prog,
            mute: OnceLock::new(),
            fds,
        }),
    );
    Ok(signal)
}

/// Forgets `pid` (detached, or exited).
pub fn disable(pid: Pid) {
    MODES.remove(&pid);
}

/// The mode of `pid`'s tracees, if it uses signal stops.
pub fn mode_of(pid: Pid) -> Option<Arc<SignalMode>> {
    MODES.get(&pid).map(|m| m.clone())
}

/// Whether this daemon may load the program at all (capabilities).
pub fn available() -> Result<(), Errno> {
    program(CANDIDATES[0]).map(|_| ())
}

/// The first candidate signal that `pid` does not catch or ignore and that
/// none of its threads blocks (`/proc/PID/status` SigCgt, SigIgn, and each
/// task's settled SigBlk, see [`procfs::settled_sigmask`]). A thread creating one
/// blocks every signal for a moment (glibc's `pthread_create`), so a signal
/// counts as blocked only if it is blocked in three looks 2 ms apart.
pub fn choose_signal(pid: Pid) -> Result<Signal, NoSignalStops> {
    let none = |caught, ignored, blocked| NoSignalStops::NoSignal {
        caught,
        ignored,
        blocked,
    };
    let st = procfs::Status::of(pid).ok_or(none(0, 0, 0))?;
    let (caught, ignored) = (
        st.mask("SigCgt").unwrap_or(u64::MAX),
        st.mask("SigIgn").unwrap_or(u64::MAX),
    );
    let taken = caught | ignored;
    let mut blocked = u64::MAX;
    for look in 0..3 {
        if look > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut now = 0u64;
        for tid in procfs::tasks(pid).map_err(|_| none(caught, ignored, u64::MAX))? {
            if let Some(m) = procfs::settled_sigmask(pid, tid) {
                now |= m;
            }
        }
        blocked &= now;
        if blocked & candidates_mask() == 0 {
            break;
        }
    }
    CANDIDATES
        .into_iter()
        .find(|&s| (taken | blocked) & bit(s) == 0)
        .ok_or(none(caught, ignored, blocked))
}

/// Why the signal `sig` no longer fits `pid`'s signal stops, if it does
/// not: the program now catches it (a handler installed after the attach:
/// its own signals of that kind coalesce with the stops' and are
/// swallowed), or one of its threads blocks it (that thread's hits stop
/// nobody and are lost). A thread blocks it only if its settled mask (see
/// [`procfs::settled_sigmask`]) does in three looks over 50 ms.
pub fn still_fits(pid: Pid, sig: Signal) -> Result<(), crate::state::LostBecause> {
    use crate::state::LostBecause;
    let Some(st) = procfs::Status::of(pid) else {
        return Ok(()); // gone: its exit is handled elsewhere
    };
    if st.mask("SigCgt").is_some_and(|m| m & bit(sig) != 0) {
        return Err(LostBecause::SignalCaught(sig as i32));
    }
    let mut blocked: Option<Vec<Tid>> = None;
    for pause in [0u64, 10, 40] {
        std::thread::sleep(std::time::Duration::from_millis(pause));
        let now: Vec<Tid> = procfs::tasks(pid)
            .unwrap_or_default()
            .into_iter()
            .filter(|&t| procfs::settled_sigmask(pid, t).is_some_and(|m| m & bit(sig) != 0))
            .collect();
        let b = match blocked {
            None => now,
            Some(prev) => prev.into_iter().filter(|t| now.contains(t)).collect(),
        };
        if b.is_empty() {
            return Ok(());
        }
        blocked = Some(b);
    }
    let tid = blocked.unwrap_or_default().first().copied().unwrap_or(0);
    Err(LostBecause::SignalBlocked(sig as i32, tid))
}

/// Processes with signal stops now, with their signal.
pub fn with_signal_stops() -> Vec<(Pid, Signal)> {
    MODES.iter().map(|e| (*e.key(), e.value().signal)).collect()
}

fn bit(s: Signal) -> u64 {
    1u64 << (s as i32 - 1)
}

fn candidates_mask() -> u64 {
    CANDIDATES.iter().fold(0, |m, &s| m | bit(s))
}

/// The BPF program `r0 = send_signal_thread(sig); return 0`, loaded once.
fn program(signal: Signal) -> Result<Arc<OwnedFd>, Errno> {
    let mut progs = PROGS.lock().unwrap();
    if let Some(p) = progs.get(&(signal as i32)) {
        return Ok(p.clone());
    }
    let fd = load(signal as i32)?;
    let p = Arc::new(fd);
    progs.insert(signal as i32, p.clone());
    Ok(p)
}

/// `r1 = sig; r0 = send_signal_thread(r1); return 0`.
fn load(sig: i32) -> Result<OwnedFd, Errno> {
    use crate::bpf::{asm, helper};
    let insns = [
        asm::mov_imm(1, sig),
        asm::call(helper::SEND_SIGNAL_THREAD),
        asm::mov_imm(0, 0),
        asm::exit(),
    ];
    crate::bpf::load_program(crate::bpf::PROG_TYPE_PERF_EVENT, &insns).map_err(|e| e.errno)
}

/// `if lookup(dead, ctx->addr) == NULL: send_signal_thread(sig); return 0`.
fn load_muting(sig: i32, dead_fd: i32) -> Result<OwnedFd, Errno> {
    use crate::arch::current::perf_ctx;
    use crate::bpf::{Program, asm, helper};
    let mut p = Program::new();
    let out = p.label();
    p.push([
        asm::mov(6, 1),
        asm::ldx_dw(1, 6, perf_ctx::ADDR),
        asm::stx_dw(10, -8, 1),
    ]);
    p.push(asm::ld_map(1, dead_fd));
    p.push([
        asm::mov(2, 10),
        asm::add_imm(2, -8),
        asm::call(helper::MAP_LOOKUP_ELEM),
    ]);
    p.jne_imm(0, 0, out);
    p.push([asm::mov_imm(1, sig), asm::call(helper::SEND_SIGNAL_THREAD)]);
    p.place(out);
    p.push([asm::mov_imm(0, 0), asm::exit()]);
    let insns = p.build().map_err(|_| Errno::EINVAL)?;
    crate::bpf::load_program(crate::bpf::PROG_TYPE_PERF_EVENT, &insns).map_err(|e| {
        tracing::warn!(log = %e, "muting breakpoint program refused");
        e.errno
    })
}

/// A per-thread breakpoint on `len` bytes at `addr` whose hits run `mode`'s
/// program (and count: read its fd), counted in `mode`'s fd budget.
/// Removed at exec.
pub fn open_breakpoint(
    tid: Tid,
    addr: u64,
    len: WatchLen,
    access: Access,
    mode: &SignalMode,
) -> Result<CountedFd, Errno> {
    use crate::backend::perf::{attr, sys};
    // The fds kept for connections are never taken (the budget's own
    // EMFILE, reported as the kernel's would be).
    if !mode.fds.fits(1) {
        return Err(Errno::EMFILE);
    }
    let mut a = attr::signal_stop(addr, len, access);
    let fd = sys::open(&mut a, tid, -1, "perf_event_open(signal stop)").map_err(|e| e.errno)?;
    let fd = mode.fds.adopt(fd);
    let prog = mode.mute.get().map_or(&*mode.prog, |m| &m.prog);
    sys::set_bpf(&fd, prog).map_err(|e| e.errno)?;
    Ok(fd)
}

/// Hits counted by a breakpoint so far.
pub fn count(fd: &impl AsRawFd) -> u64 {
    let mut v = 0u64;
    // SAFETY: reads 8 bytes into v from a perf event fd.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&raw mut v).cast(), 8) };
    if n == 8 { v } else { 0 }
}

/// True when `sig` is pending for `tid` (queued behind a stop).
pub fn pending(tid: Tid, sig: Signal) -> bool {
    procfs::Status::of(tid)
        .and_then(|s| s.mask("SigPnd"))
        .is_some_and(|mask| mask & (1u64 << (sig as i32 - 1)) != 0)
}

/// Against the kernel (root only): the breakpoints signal stops open are
/// accepted for every access kind.
#[cfg(test)]
mod kernel_tests {
    use super::*;

    #[test]
    fn every_access_kind_opens() {
        let prog = match program(CANDIDATES[0]) {
            Ok(p) => p,
            Err(Errno::EPERM) => {
                wpd_test_skip::machine_skip("bpf() refused (needs CAP_BPF)");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mode = SignalMode {
            signal: CANDIDATES[0],
            prog,
            mute: OnceLock::new(),
            fds: FdBudget::new(0),
        };
        static DATA: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let code = every_access_kind_opens as *const () as u64;
        for (addr, len, access) in [
            (DATA.as_ptr() as u64, 8, Access::Write),
            (DATA.as_ptr() as u64, 4, Access::ReadWrite),
            (code, 1, Access::Exec),
        ] {
            let len = WatchLen::new(len).unwrap();
            let r = open_breakpoint(me, addr, len, access, &mode);
            assert!(r.is_ok(), "{access:?}: {r:?}");
            // Counted while open.
            assert_eq!(mode.fds.open(), 1);
            drop(r);
            assert_eq!(mode.fds.open(), 0);
        }
        // A budget with one fd left beside its headroom: one breakpoint
        // opens, the next is refused before the kernel is asked, and the
        // refused one is not counted.
        let mode = SignalMode {
            fds: FdBudget::limited(11, 10),
            ..mode
        };
        let len = WatchLen::new(8).unwrap();
        let first = open_breakpoint(me, DATA.as_ptr() as u64, len, Access::Write, &mode);
        assert!(first.is_ok(), "{first:?}");
        let second = open_breakpoint(me, DATA.as_ptr() as u64, len, Access::Write, &mode);
        assert_eq!(second.unwrap_err(), Errno::EMFILE);
        assert_eq!(mode.fds.open(), 1);
    }
}
