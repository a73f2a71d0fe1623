//! Stepping a held thread, one leg at a time (`backend/step.rs`): a
//! single machine instruction with `PTRACE_SINGLESTEP` (the trap flag, no
//! debug register), or a run until an internal breakpoint is reached.
//!
//! Internal breakpoints are uprobes: a BPF link of the instructions'
//! offsets (`BPF_TRACE_UPROBE_MULTI`, the process's pid as its filter, a
//! return probe where the leg waits for a function's return) whose one
//! program, shared by every step of processes stopped by the same signal,
//! looks the thread and the link's cookie up in one map ([`ARM`]): only the
//! stepping thread, at or above the leg's least stack pointer, is stopped
//! (the program records where, then sends the process's signal-stop
//! signal); every other thread, and a deeper activation of the same code,
//! runs through. Why uprobes and not an `int3` poked into the text or a
//! debug register: a uprobe goes with its fd, whatever ends the daemon (an
//! `int3` left behind would kill the target with SIGTRAP at its next
//! pass), a forked child drops it (the kernel takes a uprobe out of a
//! process its filter does not name), other threads never stop at it, and
//! no debug-register slot a watchpoint needs is taken (kernel-facts §22).
//! A link's close waits for an RCU grace period: links are closed on a
//! thread of their own, after the leg.
//!
//! On the tracer: a tracee with a leg runs with `PTRACE_SINGLESTEP` or
//! `PTRACE_CONT` (`Tracer::restart`), its stops are handled as any other's
//! (hits, code breakpoints, signals delivered), and the leg ends where the
//! thread is held: its trap or its breakpoint (`Held::Step`), a hit or a
//! code breakpoint that holds it, a pause or another thread's stop-all
//! (`Interrupted`), an exec, its exit.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, mpsc};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;

use super::protocol::{Cmd, Held, Running};
use super::shards::Shards;
use super::signal_bp::SignalMode;
use super::tracer::{Phase, Tracer, npid};
use crate::arch::current::uprobe_ctx;
use crate::backend::fds::CountedFd;
use crate::backend::step::{Leg, LegEnd, LegOutcome, ProbeSet};
use crate::bpf::{self, Cmp, Program, asm, helper};
use crate::error::WpdError;
use crate::model::{Pid, Tid};

/// The map of armed internal breakpoints: key `tid << 32 | cookie`, value
/// `[least stack pointer, address where it stopped (0: not yet)]`.
static ARM: LazyLock<Result<bpf::U64Map, Errno>> = LazyLock::new(|| bpf::U64Map::new(ARM_MAX, 2));

/// Internal breakpoints armed at once, at most (one leg per stepping
/// thread, a few sets each).
const ARM_MAX: u32 = 4096;

/// The program per signal.
static PROGS: LazyLock<Mutex<std::collections::HashMap<i32, Arc<OwnedFd>>>> =
    LazyLock::new(Default::default);

/// Cookies of links (32 bits, never 0).
static NEXT_COOKIE: AtomicU64 = AtomicU64::new(1);

/// The uprobes' program: armed for this thread and link, at or above the
/// least stack pointer: record the address, send `sig`.
fn program(sig: i32, arm_fd: i32) -> Result<Vec<bpf::Insn>, Errno> {
    let mut p = Program::new();
    let out = p.label();
    p.push([asm::mov(6, 1)]);
    p.push(bpf::current_pid_tgid(crate::pidns::own(), -8));
    // r7 = tid << 32 | cookie
    p.push([asm::mov(7, 0), asm::lsh_imm(7, 32)]);
    p.push([asm::mov(1, 6), asm::call(helper::GET_ATTACH_COOKIE)]);
    p.push([asm::lsh_imm(0, 32), asm::rsh_imm(0, 32), asm::xor(7, 0)]);
    p.push([asm::stx_dw(10, -16, 7)]);
    p.push(asm::ld_map(1, arm_fd));
    p.push([
        asm::mov(2, 10),
        asm::add_imm(2, -16),
        asm::call(helper::MAP_LOOKUP_ELEM),
    ]);
    p.jeq_imm(0, 0, out);
    p.push([
        asm::mov(8, 0),
        asm::ldx_dw(1, 8, 0),
        asm::ldx_dw(2, 6, uprobe_ctx::SP),
    ]);
    p.jump_if(Cmp::Lt, 2, 1, out);
    p.push([asm::ldx_dw(1, 6, uprobe_ctx::IP), asm::stx_dw(8, 8, 1)]);
    p.push([asm::mov_imm(1, sig), asm::call(helper::SEND_SIGNAL_THREAD)]);
    p.place(out);
    p.push([asm::mov_imm(0, 0), asm::exit()]);
    p.build().map_err(|e| {
        tracing::warn!("step program: {e}");
        Errno::EINVAL
    })
}

fn arm_map() -> Result<&'static bpf::U64Map, Errno> {
    ARM.as_ref().map_err(|e| *e)
}

fn prog_for(sig: i32) -> Result<Arc<OwnedFd>, Errno> {
    let mut progs = PROGS.lock().unwrap();
    if let Some(p) = progs.get(&sig) {
        return Ok(p.clone());
    }
    let insns = program(sig, arm_map()?.raw_fd())?;
    let p = bpf::load_program_for(bpf::PROG_TYPE_KPROBE, bpf::TRACE_UPROBE_MULTI, &insns).map_err(
        |e| {
            tracing::warn!(log = %e, "step program refused");
            e.errno
        },
    )?;
    let p = Arc::new(p);
    progs.insert(sig, p.clone());
    Ok(p)
}

/// Internal breakpoints set for a leg: taken out of [`ARM`] and closed
/// (on the closer thread) when dropped.
struct Armed {
    links: Vec<CountedFd>,
    keys: Vec<u64>,
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Ok(m) = arm_map() {
            for &k in &self.keys {
                m.remove(k);
            }
        }
        close_later(std::mem::take(&mut self.links));
    }
}

/// Opens `sets` for thread `tid` of `pid`.
fn arm(pid: Pid, tid: Tid, sets: &[ProbeSet], mode: &SignalMode) -> Result<Armed, WpdError> {
    let kernel = |what: &str, e: Errno| {
        WpdError::kernel(
            match what {
                "map" => "bpf(BPF_MAP_CREATE) for stepping",
                "prog" => "bpf(BPF_PROG_LOAD) for stepping",
                _ => "bpf(BPF_LINK_CREATE) of a step's uprobe",
            },
            e,
        )
    };
    let map = arm_map().map_err(|e| kernel("map", e))?;
    let prog = prog_for(mode.signal as i32).map_err(|e| kernel("prog", e))?;
    let mut armed = Armed {
        links: Vec::new(),
        keys: Vec::new(),
    };
    for set in sets {
        let cookie = (NEXT_COOKIE.fetch_add(1, Ordering::Relaxed) % 0xffff_fff0) + 1;
        let key = (u64::from(tid as u32) << 32) | cookie;
        map.insert(key, &[set.min_sp, 0])
            .map_err(|e| kernel("map", e))?;
        armed.keys.push(key);
        let path =
            std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(set.path.as_os_str()))
                .map_err(|_| WpdError::InvalidArgument("a module path with a NUL byte".into()))?;
        let cookies = vec![cookie; set.offsets.len()];
        let link = bpf::uprobe_multi_link(&*prog, &path, &set.offsets, &cookies, set.ret, pid)
            .map_err(|e| kernel("link", e))?;
        armed.links.push(mode.fds.adopt(link));
    }
    Ok(armed)
}

/// Where the leg's breakpoint stopped the thread, if one did.
fn stopped_at(keys: &[u64]) -> Option<u64> {
    let m = arm_map().ok()?;
    keys.iter()
        .filter_map(|&k| m.get(k))
        .map(|v| v[1])
        .find(|&at| at != 0)
}

/// Links to close, handed to the closer thread.
static CLOSER: OnceLock<Mutex<mpsc::Sender<Vec<CountedFd>>>> = OnceLock::new();

/// Closes `links` on the `wpd-step-close` thread (a close waits for an RCU
/// grace period; links closed together share it, kernel-facts §21).
fn close_later(links: Vec<CountedFd>) {
    if links.is_empty() {
        return;
    }
    let tx = CLOSER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Vec<CountedFd>>();
        let spawned = std::thread::Builder::new()
            .name("wpd-step-close".into())
            .spawn(move || {
                while let Ok(mut batch) = rx.recv() {
                    std::thread::sleep(Duration::from_millis(2));
                    while let Ok(more) = rx.try_recv() {
                        batch.extend(more);
                    }
                    close_together(batch);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("no step closer thread: {e}");
        }
        Mutex::new(tx)
    });
    if let Err(mpsc::SendError(links)) = tx.lock().unwrap().send(links) {
        drop(links);
    }
}

/// Closes `links` from up to 16 threads at once: their grace periods
/// overlap.
fn close_together(links: Vec<CountedFd>) {
    if links.len() <= 1 {
        return;
    }
    let n = links.len().min(16);
    let mut groups: Vec<Vec<CountedFd>> = (0..n).map(|_| Vec::new()).collect();
    for (i, l) in links.into_iter().enumerate() {
        groups[i % n].push(l);
    }
    std::thread::scope(|s| {
        for g in groups {
            let _ = std::thread::Builder::new()
                .name("wpd-close".into())
                .stack_size(64 * 1024)
                .spawn_scoped(s, move || drop(g));
        }
    });
}

/// Runs `leg` on held thread `tid` of `pid` through `shards`, waiting for
/// its end; `cancel` set meanwhile holds the thread where it is; `running`
/// is called as it is set running.
pub(super) fn run_leg(
    shards: &Shards,
    pid: Pid,
    tid: Tid,
    leg: &Leg,
    cancel: &AtomicBool,
    running: &dyn Fn(),
) -> Result<LegOutcome, WpdError> {
    let (single, armed) = match leg {
        Leg::Instruction => (true, None),
        Leg::Run(sets) => {
            let mode = super::signal_bp::mode_of(pid).ok_or(WpdError::NeedsBackend {
                feature: "stepping by line",
                needs: None,
                hint: ": a step's internal breakpoints are uprobes that stop the thread with a \
                       signal stop, and this process has debug-register stops (bpf() refused, \
                       or it catches SIGURG and SIGWINCH); instruction steps work",
            })?;
            (false, Some(arm(pid, tid, sets, &mode)?))
        }
    };
    let keys = armed.as_ref().map(|a| a.keys.clone()).unwrap_or_default();
    running();
    let Some(rx) = shards.step_leg(tid, single, keys) else {
        return Ok(LegOutcome {
            end: LegEnd::Gone,
            signals: Vec::new(),
        });
    };
    let mut asked_stop = false;
    let out = loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(o) => break o,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break LegOutcome {
                    end: LegEnd::Gone,
                    signals: Vec::new(),
                };
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if cancel.load(Ordering::Relaxed) && !asked_stop {
                    asked_stop = true;
                    shards.hold(&[tid]);
                }
            }
        }
    };
    drop(armed);
    Ok(out)
}

impl Running {
    /// Its tracee is gone (exited, detached): the leg is answered so.
    pub(super) fn gone(&self) {
        let _ = self.reply.send(LegOutcome {
            end: LegEnd::Gone,
            signals: self.signals.clone(),
        });
    }
}

impl Tracer {
    /// `Cmd::StepLeg`: starts a leg on held tracee `tid`.
    pub(super) fn step_leg(
        &mut self,
        tid: Tid,
        single: bool,
        keys: Vec<u64>,
        reply: mpsc::Sender<LegOutcome>,
    ) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            let _ = reply.send(LegOutcome {
                end: LegEnd::Gone,
                signals: Vec::new(),
            });
            return;
        };
        if !t.is_held()
            || matches!(t.phase, Phase::Held(Held::Parked(_)))
            || t.step.is_some()
            || t.next.detach.is_some()
        {
            let _ = reply.send(LegOutcome {
                end: LegEnd::NotHeld,
                signals: Vec::new(),
            });
            return;
        }
        if single && t.undone.is_some() && self.redo_branch(tid) {
            // Held before the branch its code breakpoint sits on: running
            // it again is the instruction.
            if let Some(t) = self.tracees.get_mut(&tid) {
                t.phase = Phase::Held(Held::Step(false));
            }
            let _ = reply.send(LegOutcome {
                end: LegEnd::Done { at: 0 },
                signals: Vec::new(),
            });
            return;
        }
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        t.step = Some(Box::new(Running {
            single,
            keys,
            reply,
            trapped: false,
            exec: false,
            signals: Vec::new(),
        }));
        t.phase = Phase::Running;
        t.next.hold = false;
        self.restart(tid, None);
    }

    /// `Cmd::StepDone`: the step of held tracee `tid` is over. Held at a
    /// single step's trap (a SIGTRAP stop, which a dying tracer would turn
    /// into the signal's delivery: kernel-facts §2b), it is moved to an
    /// event stop (interrupted, then restarted with no signal: it stops
    /// again before its next instruction, kernel-facts §22).
    pub(super) fn step_done(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        if t.phase != Phase::Held(Held::Step(true)) || t.next.detach.is_some() {
            return;
        }
        if ptrace::interrupt(npid(tid)).is_err() {
            return;
        }
        t.phase = Phase::Interrupted(std::time::Instant::now());
        t.next.hold = true;
        t.next.hold_step = true;
        if ptrace::cont(npid(tid), None).is_err() {
            return;
        }
        // Its event stop comes at once (no instruction runs first): taken
        // here, so that the thread is held again before the step's answer.
        let flags = nix::sys::wait::WaitPidFlag::__WALL | nix::sys::wait::WaitPidFlag::__WNOTHREAD;
        if let Ok(st) = nix::sys::wait::waitpid(npid(tid), Some(flags)) {
            self.event(st);
        }
    }

    /// `Cmd::LeaveTrampoline`: see `Backend::leave_trampoline`.
    pub(super) fn leave_trampoline(&mut self, tid: Tid, ret: u64) -> bool {
        if !self.tracees.get(&tid).is_some_and(|t| t.is_held()) {
            return false;
        }
        let pid = self.tracees[&tid].pid;
        let Ok(mut regs) = ptrace::getregs(npid(tid)) else {
            return false;
        };
        let read = |a: u64| {
            let b = crate::procfs::read_memory(pid, tid, a, 8).ok()?;
            Some(u64::from_le_bytes(b.try_into().ok()?))
        };
        crate::arch::current::insn::leave_return_trampoline(&mut regs, read, ret)
            && ptrace::setregs(npid(tid), regs).is_ok()
    }

    /// Whether tracee `tid` runs a single step.
    pub(super) fn stepping_single(&self, tid: Tid) -> bool {
        self.tracees
            .get(&tid)
            .and_then(|t| t.step.as_ref())
            .is_some_and(|s| s.single)
    }

    /// A SIGTRAP of a tracee in a single step: its trap (a data hit the
    /// instruction made is read now, at the instruction: with debug
    /// registers from DR6, with signal stops from the breakpoints' counts,
    /// whose own signal comes later and is swallowed).
    pub(super) fn step_trap(&mut self, tid: Tid) {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return;
        };
        t.single_in_flight = false;
        if let Some(s) = t.step.as_mut() {
            s.trapped = true;
        }
        let ids = {
            let mut regs = t.regs.lock();
            if regs.has_signal_stops() {
                regs.signal_hits()
            } else {
                let dr6 = ptrace::read_user(
                    npid(tid),
                    crate::arch::current::debugreg_offset(crate::arch::current::DR6) as _,
                )
                .unwrap_or(0) as u64;
                regs.watches_hit(dr6)
            }
        };
        if ids.is_empty() {
            self.after_stop(tid, None);
        } else {
            self.hit_stop(tid, ids);
        }
    }

    /// Its process called exec during a leg.
    pub(super) fn step_exec(&mut self, tid: Tid) {
        if let Some(s) = self.tracees.get_mut(&tid).and_then(|t| t.step.as_mut()) {
            s.exec = true;
        }
    }

    /// At the end of a stop of tracee `tid` (`after_stop`, not detaching):
    /// if its leg is over (its trap came, a breakpoint of its stopped it,
    /// an exec), it is held there and the leg answered; true then. A
    /// signal about to be delivered is counted in the leg.
    pub(super) fn step_stop(&mut self, tid: Tid, sig: Option<Signal>) -> bool {
        let Some(t) = self.tracees.get_mut(&tid) else {
            return false;
        };
        let Some(s) = t.step.as_mut() else {
            return false;
        };
        if let Some(sig) = sig {
            s.signals.push(sig as i32);
            return false;
        }
        let at = if s.single { None } else { stopped_at(&s.keys) };
        let end = if s.exec {
            LegEnd::Exec
        } else if s.trapped {
            LegEnd::Done { at: 0 }
        } else if let Some(at) = at {
            LegEnd::Done { at }
        } else {
            return false;
        };
        let trap = s.trapped;
        t.phase = Phase::Held(Held::Step(trap));
        t.next.hold = false;
        for id in t.next.park.take() {
            self.parks.progress(id, |v| v.push(tid));
        }
        self.end_leg(tid, end);
        true
    }

    /// Answers tracee `tid`'s leg, if it has one.
    pub(super) fn end_leg(&mut self, tid: Tid, end: LegEnd) {
        if let Some(s) = self.tracees.get_mut(&tid).and_then(|t| t.step.take()) {
            let _ = s.reply.send(LegOutcome {
                end,
                signals: s.signals,
            });
        }
    }

    /// The restart of tracee `tid` in a leg: `PTRACE_SINGLESTEP` or
    /// `PTRACE_CONT` with `sig`; `None` when it has none.
    pub(super) fn step_restart(&mut self, tid: Tid, sig: Option<Signal>) -> Option<()> {
        let t = self.tracees.get_mut(&tid)?;
        let s = t.step.as_ref()?;
        t.single_in_flight |= s.single;
        let _ = if s.single {
            ptrace::step(npid(tid), sig)
        } else {
            ptrace::cont(npid(tid), sig)
        };
        Some(())
    }
}

impl Shards {
    /// Starts a leg on held tracee `tid`; its outcome comes on the
    /// receiver. `None`: not ours.
    pub fn step_leg(
        &self,
        tid: Tid,
        single: bool,
        keys: Vec<u64>,
    ) -> Option<mpsc::Receiver<LegOutcome>> {
        let s = self.owner_of(tid)?;
        let (tx, rx) = mpsc::channel();
        self.send(
            s,
            Cmd::StepLeg {
                tid,
                single,
                keys,
                reply: tx,
            },
        );
        Some(rx)
    }

    /// The step of held tracee `tid` is over; returns once it is held in
    /// its last stop.
    pub fn step_done(&self, tid: Tid) {
        if let Some(s) = self.owner_of(tid) {
            let (tx, rx) = mpsc::channel();
            self.send(s, Cmd::StepDone { tid, reply: tx });
            let _ = rx.recv();
        }
    }

    /// See `Backend::leave_trampoline`.
    pub fn leave_trampoline(&self, tid: Tid, ret: u64) -> bool {
        let Some(s) = self.owner_of(tid) else {
            return false;
        };
        let (tx, rx) = mpsc::channel();
        self.send(
            s,
            Cmd::LeaveTrampoline {
                tid,
                ret,
                reply: tx,
            },
        );
        rx.recv().unwrap_or(false)
    }
}
