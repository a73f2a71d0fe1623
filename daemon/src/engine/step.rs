//! Stepping a held thread: which legs (`backend/step.rs`) make a step.
//!
//! 1. *Instruction*: one single step (the trap flag). *Over* a call: the
//!    call single-stepped, then a run to the callee's return.
//! 2. *Line* (next) and *into* (step in): single steps within the line;
//!    each stop is looked at:
//!    - in the same function and the same activation (the canonical frame
//!      address, from the call frame information, is the step's: a
//!      recursive call is another activation), at the first instruction
//!      of a statement of another line: done;
//!    - just entered a function by a call from the step's code (the stack
//!      pointer 8 lower, the word there a return address just past the
//!      instruction before): into a function with line information (step
//!      in), the step goes on there until its body's first line; else the
//!      call runs through: a return probe on the callee's first
//!      instruction, the thread run until its return (at or above the
//!      stack pointer of this call: recursion passes through), held at the
//!      return address;
//!    - entered a signal handler (deeper, not a call): its run is a call's;
//!    - left the step's frame (a return, a `longjmp`): done, in the caller;
//!    - a jump out of the function with the frame torn down (a tail call):
//!      run to that function's return (step in: entered when it has
//!      lines).
//! 3. *Out*: a run until the function returns; at its first instruction
//!    (an instruction step into a call), a return probe there; else uprobes on its `ret`
//!    instructions (decoded from the module's file), counted only at the
//!    frame's stack pointer (deeper activations pass through), on its jumps
//!    out of the function (tail calls, then run to that callee's return),
//!    and one on the return address itself (a way out the others miss: it
//!    stops one instruction late, said in the answer's note).
//!
//! A line with no line information (a library without `-g`) is stepped
//! out of, as gdb does. Whatever stops the thread first (a data breakpoint
//! that holds it, a code breakpoint, a pause, another thread's stop-all,
//! an exec, its exit) ends the step, reported as itself.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::Core;
use crate::arch::current::insn::{self, Flow};
use crate::backend::step::{Leg, LegEnd, ProbeSet};
use crate::backend::{Backend, RunState};
use crate::error::WpdError;
use crate::model::{Pid, Tid};
use crate::procfs;
use crate::symbols::step::{CodeView, FunctionAt, LineAt};

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// One machine instruction (into a call).
    Instruction,
    /// One machine instruction, a call run through.
    InstructionOver,
    /// To the next line of the function (next).
    Line,
    /// To the next line, entering calls with line information (step in).
    Into,
    /// Until the function returns (step out).
    Out,
}

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepEnd {
    /// Done, held where it took the thread.
    Done,
    /// Held at a data breakpoint's hit.
    Hit,
    /// Held at a code breakpoint.
    Breakpoint,
    /// Held by a pause or another thread's stop-all first.
    Interrupted,
    /// Its process called exec.
    Exec,
    /// It exited (or is no longer traced).
    Exited,
}

/// What a step answers.
#[derive(Debug)]
pub struct StepResult {
    /// How it ended.
    pub end: StepEnd,
    /// Where the thread is held (none when it exited).
    pub stack: Option<super::watch::ThreadStack>,
    /// Signals delivered to it meanwhile.
    pub signals: Vec<i32>,
    /// Anything worth saying about where it stopped.
    pub note: Option<String>,
    /// Legs it took.
    pub legs: u32,
}

/// How long one leg of a step whose others run (`others_run`) runs before
/// the others held are resumed. A step is a few legs of a millisecond or
/// less each: one whose legs all end sooner is one during which a
/// scheduler could have given the others no time at all, and it costs no
/// resume and no stop of every thread again (at 1,000 threads on 2 CPUs,
/// most of such a step's time: docs/benchmarks.md, target 11). Time the
/// daemon spends between legs (setting a leg's breakpoints, reading line
/// tables) does not count: the thread cannot wait for the others then. A
/// leg that runs longer (a call that sleeps, or waits for another thread:
/// a lock, a condition) has them running from then on.
const OTHERS_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

/// How long a step whose others run leaves them held in all, however
/// short its legs (a line that spins on a flag another thread sets).
const OTHERS_AFTER_ALL: std::time::Duration = std::time::Duration::from_millis(50);

/// Waits, on the step's thread of its own, until the others must run: a
/// leg has run `OTHERS_AFTER` (told by the stepper: true as the thread
/// is set running in a leg, false as the leg ends), or the step has lasted `OTHERS_AFTER_ALL`. False when
/// the step ended first (its sender dropped).
fn others_wait(legs: &std::sync::mpsc::Receiver<bool>) -> bool {
    use std::sync::mpsc::RecvTimeoutError;
    use std::time::Instant;
    let all = Instant::now() + OTHERS_AFTER_ALL;
    let mut leg: Option<Instant> = None;
    loop {
        let until = leg.map_or(all, |l| (l + OTHERS_AFTER).min(all));
        match legs.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(true) => leg = Some(Instant::now()),
            Ok(false) => leg = None,
            Err(RecvTimeoutError::Timeout) => return true,
            Err(RecvTimeoutError::Disconnected) => return false,
        }
    }
}

/// Most legs one step takes before it stops where it is (a line that
/// loops on itself a long time).
const MAX_LEGS: u32 = 20_000;

/// One step in progress.
struct Stepper<'a> {
    backend: &'a Arc<dyn Backend>,
    pid: Pid,
    tid: Tid,
    cancel: &'a AtomicBool,
    /// Told when each leg starts and ends (`others_run`: `others_wait`).
    legs_told: Option<std::sync::mpsc::Sender<bool>>,
    legs: u32,
    signals: Vec<i32>,
    note: Option<String>,
}

/// A leg's outcome for the step: on (`Ok`), or the step ends (`Err`).
type Next<T> = Result<T, StepEnd>;

impl Stepper<'_> {
    fn leg(&mut self, leg: Leg) -> Result<Next<u64>, WpdError> {
        self.legs += 1;
        let tell = |on: bool| {
            if let Some(tx) = &self.legs_told {
                let _ = tx.send(on);
            }
        };
        let out = self
            .backend
            .step_leg(self.pid, self.tid, &leg, self.cancel, &|| tell(true));
        tell(false);
        let out = out?;
        self.signals.extend(out.signals);
        Ok(match out.end {
            LegEnd::Done { at } => {
                if self.cancel.load(std::sync::atomic::Ordering::Relaxed) {
                    Err(StepEnd::Interrupted)
                } else {
                    Ok(at)
                }
            }
            LegEnd::Hit => Err(StepEnd::Hit),
            LegEnd::Code => Err(StepEnd::Breakpoint),
            LegEnd::Interrupted => Err(StepEnd::Interrupted),
            LegEnd::Exec => Err(StepEnd::Exec),
            LegEnd::Gone => Err(StepEnd::Exited),
            LegEnd::NotHeld => {
                return Err(WpdError::NotHeld {
                    pid: self.pid,
                    tid: self.tid,
                });
            }
        })
    }

    fn single(&mut self) -> Result<Next<()>, WpdError> {
        Ok(self.leg(Leg::Instruction)?.map(|_| ()))
    }

    /// One instruction, and through the kernel's return trampoline if the
    /// instruction was a return into it: a return address an earlier
    /// leg's return probe took (a step over a call that a breakpoint in the
    /// call ended) goes through the trampoline, which gives it back; the
    /// thread is shown where the return went, not in the trampoline (from
    /// which no step could go on: it has no call frame information).
    fn single_through(&mut self, code: &mut CodeView<'_>) -> Result<Next<()>, WpdError> {
        if let Err(e) = self.single()? {
            return Ok(Err(e));
        }
        self.through_trampoline(code)
    }

    /// Out of the kernel's return trampoline, if a return took the thread
    /// there (see `single_through`): single steps to where it returns.
    fn through_trampoline(&mut self, code: &mut CodeView<'_>) -> Result<Next<()>, WpdError> {
        for _ in 0..16 {
            let (pc, _, _) = self.regs()?;
            if code.probe_place(pc).is_some() || !CodeView::in_return_trampoline(self.pid, pc) {
                break;
            }
            if let Err(e) = self.single()? {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }

    /// (ip, sp, fp) of the held thread.
    fn regs(&self) -> Result<(u64, u64, u64), WpdError> {
        let r = self.backend.held_registers(self.pid, self.tid)?;
        Ok((r.ip, r.sp, r.fp))
    }

    fn read(&self, at: u64) -> Option<u64> {
        let b = procfs::read_memory(self.pid, self.tid, at, 8).ok()?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }

    /// The thread is at the first instruction of a function entered with
    /// stack pointer `sp` (return address `ret` there): run it to its
    /// return; held at `ret`.
    fn over_call(
        &mut self,
        code: &mut CodeView<'_>,
        entry: u64,
        sp: u64,
        ret: u64,
    ) -> Result<Next<()>, WpdError> {
        let Some((path, off)) = code.probe_place(entry) else {
            // Code no file maps (the vDSO): stepped until it returns.
            for _ in 0..MAX_LEGS {
                if let Err(e) = self.single()? {
                    return Ok(Err(e));
                }
                if self.regs()?.1 > sp {
                    return Ok(Ok(()));
                }
            }
            return Ok(Ok(()));
        };
        let set = ProbeSet {
            path,
            offsets: vec![off],
            ret: true,
            min_sp: sp + 8,
        };
        if let Err(e) = self.leg(Leg::Run(vec![set]))? {
            return Ok(Err(e));
        }
        self.out_of_trampoline(ret)
    }

    /// After a return probe's stop: in the kernel's return trampoline
    /// (kernel-facts §22), moved on to `ret`.
    fn out_of_trampoline(&mut self, ret: u64) -> Result<Next<()>, WpdError> {
        let (pc, _, _) = self.regs()?;
        if pc == ret || !CodeView::in_return_trampoline(self.pid, pc) {
            return Ok(Ok(()));
        }
        if self.backend.leave_trampoline(self.pid, self.tid, ret) {
            return Ok(Ok(()));
        }
        for _ in 0..16 {
            if let Err(e) = self.single()? {
                return Ok(Err(e));
            }
            if self.regs()?.0 == ret {
                break;
            }
        }
        Ok(Ok(()))
    }

    fn instruction(&mut self, code: &mut CodeView<'_>, over: bool) -> Result<StepEnd, WpdError> {
        let (pc, _, _) = self.regs()?;
        let call = over
            && code
                .code(pc, insn::MAX_INSN as usize)
                .and_then(|b| insn::decode(&b, pc).first().map(|i| i.flow))
                == Some(Flow::Call);
        if let Err(e) = self.single_through(code)? {
            return Ok(e);
        }
        if call {
            let (entry, sp, _) = self.regs()?;
            let ret = self.read(sp).unwrap_or(0);
            if let Err(e) = self.over_call(code, entry, sp, ret)? {
                return Ok(e);
            }
        }
        Ok(StepEnd::Done)
    }

    fn line(&mut self, code: &mut CodeView<'_>, into: bool) -> Result<StepEnd, WpdError> {
        let (pc0, sp0, fp0) = self.regs()?;
        let (Some(line0), Some(func0)) =
            (code.line(pc0).filter(|l| l.line != 0), code.function(pc0))
        else {
            self.note = Some("no line information here: stepped out of the function".into());
            return self.out(code);
        };
        let mut at_line: LineAt = line0;
        let mut func: FunctionAt = func0;
        let mut cfa0 = code.cfa(pc0, sp0, fp0);
        let mut prev = (pc0, sp0);
        while self.legs < MAX_LEGS {
            if let Err(e) = self.single_through(code)? {
                return Ok(e);
            }
            let (pc, sp, fp) = self.regs()?;
            let in_func = func.holds(pc);
            let cfa = if in_func { code.cfa(pc, sp, fp) } else { None };
            let same = in_func
                && match (cfa, cfa0) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                };
            if same {
                if let Some(l) = code.line(pc)
                    && l.start == pc
                    && l.stmt
                    && l.line != 0
                    && !l.same_line(&at_line)
                {
                    return Ok(StepEnd::Done);
                }
                prev = (pc, sp);
                continue;
            }
            if in_func
                && let (Some(a), Some(b)) = (cfa, cfa0)
                && a > b
            {
                // Back in an outer activation of the same function.
                return Ok(StepEnd::Done);
            }
            let from_ours = func.holds(prev.0);
            let ret = self.read(sp).unwrap_or(0);
            let called = from_ours
                && sp.wrapping_add(8) == prev.1
                && ret > prev.0
                && ret <= prev.0 + insn::MAX_INSN;
            let left = match cfa0 {
                Some(c) => sp >= c,
                None => !in_func && sp > prev.1,
            };
            if called || (from_ours && !in_func && !left && sp >= prev.1) {
                // A call, or a jump out of the function (a tail call).
                if into && code.has_lines(pc) {
                    let Some(f) = code.function(pc) else {
                        return Ok(StepEnd::Done);
                    };
                    if code.body_start(f.entry) == pc {
                        return Ok(StepEnd::Done);
                    }
                    cfa0 = code.cfa(pc, sp, fp);
                    at_line = code.line(pc).unwrap_or(at_line);
                    func = f;
                    prev = (pc, sp);
                    continue;
                }
                if let Err(e) = self.over_call(code, pc, sp, ret)? {
                    return Ok(e);
                }
                if !called {
                    // The tail-called function returned to the caller.
                    return Ok(StepEnd::Done);
                }
                let (pc, sp, _) = self.regs()?;
                if let Some(l) = code.line(pc)
                    && l.start == pc
                    && l.stmt
                    && l.line != 0
                    && !l.same_line(&at_line)
                {
                    return Ok(StepEnd::Done);
                }
                prev = (pc, sp);
                continue;
            }
            if left {
                // Returned out of the step's frame (or a longjmp did).
                return Ok(StepEnd::Done);
            }
            if from_ours && sp < prev.1 {
                // A signal handler: run through like a call.
                if let Err(e) = self.over_call(code, pc, sp, ret)? {
                    return Ok(e);
                }
            }
            let (pc, sp, _) = self.regs()?;
            prev = (pc, sp);
        }
        self.note = Some(format!(
            "stopped after {MAX_LEGS} steps without reaching another line"
        ));
        Ok(StepEnd::Done)
    }

    fn out(&mut self, code: &mut CodeView<'_>) -> Result<StepEnd, WpdError> {
        let (pc, sp, fp) = self.regs()?;
        let cfa = code.cfa(pc, sp, fp);
        let (Some(cfa), Some(ret)) = (cfa, cfa.and_then(|c| self.read(c.wrapping_sub(8)))) else {
            return Err(WpdError::CannotStep {
                pid: self.pid,
                tid: self.tid,
                why: "its frame's return address is not known here (no call frame information)"
                    .into(),
            });
        };
        if ret == 0 {
            return Err(WpdError::CannotStep {
                pid: self.pid,
                tid: self.tid,
                why: "this is the outermost frame: there is no caller to return to".into(),
            });
        }
        if cfa == sp.wrapping_add(8) && code.probe_place(pc).is_some() {
            // At its first instruction (an instruction step into a call):
            // a return probe there lands on the return address itself.
            return Ok(match self.over_call(code, pc, sp, ret)? {
                Ok(()) => StepEnd::Done,
                Err(e) => e,
            });
        }
        let mut sets: Vec<ProbeSet> = Vec::new();
        let mut tails: Vec<u64> = Vec::new();
        if let Some(f) = code.function(pc) {
            let mut rets = Vec::new();
            for &(lo, hi) in &f.ranges {
                let Some(bytes) = code.code(lo, (hi - lo) as usize) else {
                    continue;
                };
                for i in insn::decode(&bytes, lo) {
                    match i.flow {
                        Flow::Return => rets.push(i.addr),
                        Flow::Jump {
                            target: Some(t),
                            conditional: false,
                        } if !f.holds(t) => tails.push(i.addr),
                        _ => {}
                    }
                }
            }
            for (addrs, _) in [(&rets, ()), (&tails, ())] {
                let places: Vec<(std::path::PathBuf, u64)> =
                    addrs.iter().filter_map(|&a| code.probe_place(a)).collect();
                if let Some((path, _)) = places.first() {
                    sets.push(ProbeSet {
                        path: path.clone(),
                        offsets: places.iter().map(|p| p.1).collect(),
                        ret: false,
                        min_sp: cfa - 8,
                    });
                }
            }
        }
        if let Some((path, off)) = code.probe_place(ret) {
            sets.push(ProbeSet {
                path,
                offsets: vec![off],
                ret: false,
                min_sp: cfa,
            });
        }
        if sets.is_empty() {
            return Err(WpdError::CannotStep {
                pid: self.pid,
                tid: self.tid,
                why: "no module file maps this code or its caller's".into(),
            });
        }
        let at = match self.leg(Leg::Run(sets))? {
            Ok(at) => at,
            Err(e) => return Ok(e),
        };
        if at == ret {
            self.note = Some(
                "left the function another way than its returns: stopped one instruction \
                 after the return address"
                    .into(),
            );
        } else if tails.contains(&at) {
            let (entry, sp, _) = self.regs()?;
            if let Err(e) = self.over_call(code, entry, sp, ret)? {
                return Ok(e);
            }
        } else if let Err(e) = self.through_trampoline(code)? {
            // A `ret` whose return address a return probe had taken.
            return Ok(e);
        }
        Ok(StepEnd::Done)
    }
}

impl Core {
    /// Steps held thread `tid` of `pid` as `kind` says; with `others_run`
    /// the process's other held threads run meanwhile and are held again
    /// at the end. `cancel` set meanwhile stops the thread where it is.
    /// The answer has the thread's stack, `depth` frames. Blocking.
    pub fn step(
        &self,
        pid: Pid,
        tid: Tid,
        kind: StepKind,
        others_run: bool,
        depth: usize,
        cancel: &AtomicBool,
    ) -> Result<StepResult, WpdError> {
        let began = std::time::Instant::now();
        let backend = self.stopping_backend(pid, "stepping", &[tid])?;
        backend.held_registers(pid, tid)?;
        let mut code = self
            .symbols
            .code_view(pid)
            .map_err(|_| WpdError::NoSuchProcess(pid))?;
        // The others held now run during the step, but only once it has
        // lasted OTHERS_AFTER: a step that ends sooner leaves them where
        // they were (no resume, no stop of them all again).
        let states = if others_run {
            backend.thread_states(pid)
        } else {
            Default::default()
        };
        let others: Vec<Tid> = states
            .iter()
            .filter(|&(&t, &s)| {
                t != tid
                    && matches!(
                        s,
                        RunState::StoppedAtHit
                            | RunState::StoppedByPeer
                            | RunState::StoppedAfterStep
                    )
            })
            .map(|(&t, _)| t)
            .collect();
        let running_before = states
            .iter()
            .any(|(&t, &s)| t != tid && s == RunState::Running);
        let (legs_tx, legs_rx) = std::sync::mpsc::channel::<bool>();
        let mut s = Stepper {
            backend,
            pid,
            tid,
            cancel,
            legs_told: (!others.is_empty()).then_some(legs_tx),
            legs: 0,
            signals: Vec::new(),
            note: None,
        };
        let (end, others_ran) = std::thread::scope(|sc| {
            let timer = (!others.is_empty()).then(|| {
                let others = &others;
                sc.spawn(move || others_wait(&legs_rx) && backend.resume(pid, others).is_ok())
            });
            let end = match kind {
                StepKind::Instruction => s.instruction(&mut code, false),
                StepKind::InstructionOver => s.instruction(&mut code, true),
                StepKind::Line => s.line(&mut code, false),
                StepKind::Into => s.line(&mut code, true),
                StepKind::Out => s.out(&mut code),
            };
            s.legs_told = None;
            let ran = timer.is_some_and(|t| t.join().unwrap_or(false));
            (end, ran)
        });
        let stepped = began.elapsed();
        if (others_ran || running_before) && !matches!(end, Ok(StepEnd::Exited)) {
            let _ = backend.pause(pid, &[]);
        }
        tracing::debug!(
            pid, tid, ?kind, legs = s.legs, others_ran, ?stepped, with_stop = ?began.elapsed(),
            end = ?end.as_ref().map_err(ToString::to_string),
            ip = ?backend.held_registers(pid, tid).map(|r| format!("{:#x}", r.ip)).ok(),
            "step"
        );
        let end = end?;
        let stack = if end == StepEnd::Exited {
            None
        } else {
            // Read where it is first: its stop is changed next.
            let stack = self.thread_stack(pid, tid, depth.max(1), false).ok();
            backend.step_done(pid, tid);
            stack
        };
        Ok(StepResult {
            end,
            stack,
            signals: s.signals,
            note: s.note,
            legs: s.legs,
        })
    }
}

impl Core {
    /// Writes `data` at `addr` of attached process `pid` (through
    /// `/proc/PID/mem`, as a debugger's poke): the bytes written, and why
    /// the rest could not be. Blocking.
    pub fn write_memory(
        &self,
        pid: Pid,
        addr: u64,
        data: &[u8],
    ) -> Result<(usize, Option<String>), WpdError> {
        use std::os::unix::fs::FileExt;
        if !self.procs.contains_key(&pid) {
            return Err(WpdError::NotAttached(pid));
        }
        let refused = |why: String| WpdError::PermissionDenied { pid, detail: why };
        if crate::procfs::yama::assumed_refuses(pid) {
            return Err(refused(crate::procfs::yama::refusal().unwrap_or_default()));
        }
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(
                |e| match (e.raw_os_error(), crate::procfs::yama::refusal()) {
                    (Some(libc::EPERM | libc::EACCES), Some(why)) => refused(why),
                    _ => WpdError::NoSuchProcess(pid),
                },
            )?;
        let mut done = 0;
        while done < data.len() {
            match f.write_at(&data[done..], addr + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) => {
                    return Ok((
                        done,
                        Some(format!(
                            "{} bytes at {:#x} could not be written: {e}",
                            data.len() - done,
                            addr + done as u64
                        )),
                    ));
                }
            }
        }
        Ok((done, None))
    }
}
