//! The ptrace backend's facade: what the daemon asks of its tracer shards
//! (seize, program, park, resume, detach, list), and the types they speak.
//!
//! Rules the kernel imposes (kernel-facts §1–3) and how they shape the
//! backend:
//! - ptrace requests must come from the thread that attached: each tracee
//!   belongs to one *shard*, a dedicated OS thread, for its whole life.
//!   Threads created by a tracee (`PTRACE_O_TRACECLONE`) belong to the same
//!   tracer thread as their creator.
//! - A shard waits only on its own tracees (`__WNOTHREAD`), and on a named
//!   one when it can: `waitpid(-1)` walks every tracee of the shard
//!   (O(tracees) per call), while `waitpid(tid)` looks the tracee up
//!   directly.
//! - Registers can be written only while a tracee is in a ptrace-stop:
//!   changes are staged, the tracee is interrupted, and the change is
//!   applied at its next stop. A batch over many tracees interrupts them all
//!   first, then applies as stops arrive — never interrupt-then-wait one at
//!   a time.
//! - A process-wide arm first *parks* its threads (interrupted, kept
//!   stopped), so that every thread's free slot is checked before any
//!   address is written, then programs them at that same stop and unparks
//!   them.
//! - Before detaching, DR7 is written 0: ptrace-set registers survive the
//!   tracer, and a hit with no tracer kills the target with SIGTRAP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use dashmap::DashMap;
use nix::errno::Errno;

use super::protocol::Cmd;
pub use super::protocol::{
    Arm, Held, HitVerdict, ProgramResult, SlotProgram, TraceSink, TraceeState,
};
use super::tracer::Tracer;
use super::wake::{Bell, IS_TRACER, ROUTER, Router, install_sigchld_handler};
use crate::backend::HeldRegisters;
use crate::model::{Pid, Tid};

struct Shard {
    tx: mpsc::Sender<Cmd>,
    bell: Arc<Bell>,
}

/// The tracer shards and which tracee each owns.
pub struct Shards {
    shards: Vec<Shard>,
    /// Tracee → shard index (a tracee's requests must go to its tracer).
    owner: Arc<DashMap<Tid, usize>>,
    /// The registers tracers may program across shards (`Tracer::reach`).
    reach: Arc<DashMap<Tid, super::regs::SharedRegs>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("shards", &self.shards.len())
            .finish()
    }
}

impl Shards {
    /// Starts `shards` tracer threads delivering events to `sink`.
    pub fn new(shards: usize, sink: std::sync::Weak<dyn TraceSink>) -> Self {
        let first = ROUTER.get().is_none();
        let router = ROUTER.get_or_init(|| {
            Mutex::new(Router {
                bells: Vec::new(),
                owners: Vec::new(),
            })
        });
        if first {
            install_sigchld_handler();
        }
        let owner = Arc::new(DashMap::new());
        let reach = Arc::new(DashMap::new());
        // Shard indices are per backend; with one backend per process (the
        // daemon) they match the bell order. Another backend (tests) falls
        // back to ringing every shard.
        {
            let mut r = router.lock().unwrap();
            if r.owners.is_empty() {
                r.owners.push(owner.clone());
            }
        }
        let mut v = Vec::with_capacity(shards);
        for i in 0..shards.max(1) {
            let (tx, rx) = mpsc::channel();
            let bell = Arc::new(Bell::new());
            router.lock().unwrap().bells.push(bell.clone());
            let mut tracer = Tracer::new(
                i,
                rx,
                bell.clone(),
                sink.clone(),
                owner.clone(),
                reach.clone(),
            );
            std::thread::Builder::new()
                .name(format!("wpd-tracer-{i}"))
                .spawn(move || {
                    IS_TRACER.with(|t| t.set(true));
                    // A tracer that dies leaves its tracees detached with
                    // armed registers (kernel-facts §2): on a panic, clear
                    // and detach them, then end the daemon (without this
                    // shard it cannot answer for the others' tracees; its
                    // exit closes every perf fd and detaches them).
                    let run =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tracer.run()));
                    if run.is_err() {
                        tracer.detach_everything();
                        tracing::error!(
                            "a tracer thread panicked; its tracees are detached: exiting"
                        );
                        std::process::abort();
                    }
                })
                .expect("spawn tracer");
            v.push(Shard { tx, bell });
        }
        Shards {
            shards: v,
            owner,
            reach,
            next: AtomicU64::new(0),
        }
    }

    /// The shard of tracee `tid`.
    pub(super) fn owner_of(&self, tid: Tid) -> Option<usize> {
        self.owner.get(&tid).map(|s| *s)
    }

    pub(super) fn send(&self, shard: usize, cmd: Cmd) {
        let s = &self.shards[shard];
        let _ = s.tx.send(cmd);
        s.bell.ring();
    }

    /// Seizes `tids` of `pid`, spread over the shards. Per-tid results.
    pub fn seize(&self, pid: Pid, tids: &[Tid]) -> Vec<(Tid, Result<(), Errno>)> {
        let n = self.shards.len();
        let mut per: Vec<Vec<Tid>> = vec![Vec::new(); n];
        for &t in tids {
            let s = (self.next.fetch_add(1, Ordering::Relaxed) as usize) % n;
            per[s].push(t);
        }
        let (tx, rx) = mpsc::channel();
        let mut waiting = 0;
        for (s, tids) in per.into_iter().enumerate() {
            if !tids.is_empty() {
                waiting += 1;
                self.send(
                    s,
                    Cmd::Seize {
                        pid,
                        tids,
                        reply: tx.clone(),
                    },
                );
            }
        }
        (0..waiting)
            .flat_map(|_| rx.recv().unwrap_or_default())
            .collect()
    }

    /// Programs slots; waits until every change is applied (or failed).
    /// `in_place`: tracees with signal stops are programmed at once,
    /// without a stop (their slots are perf breakpoints, kernel-facts §17).
    pub fn program(
        &self,
        items: Vec<SlotProgram>,
        in_place: bool,
    ) -> Vec<(SlotProgram, ProgramResult)> {
        let mut per: HashMap<usize, Vec<SlotProgram>> = HashMap::new();
        let mut out = Vec::new();
        for it in items {
            match self.owner.get(&it.tid).map(|s| *s) {
                Some(s) => per.entry(s).or_default().push(it),
                None => out.push((it, ProgramResult::Gone)),
            }
        }
        let (tx, rx) = mpsc::channel();
        let waiting = per.len();
        for (s, items) in per {
            self.send(
                s,
                Cmd::Program {
                    items,
                    in_place,
                    reply: tx.clone(),
                },
            );
        }
        for _ in 0..waiting {
            out.extend(rx.recv().unwrap_or_default());
        }
        out
    }

    /// Stops `tids` and keeps them stopped until [`Shards::unpark`]
    /// (or `PARK_MAX`); returns those that are stopped (parked, or already
    /// held by a hit). Programs sent meanwhile apply at once and leave them
    /// stopped.
    pub fn park(&self, tids: &[Tid]) -> Vec<Tid> {
        self.stop(tids, false)
    }

    /// Stops `tids` and holds them as peers of a stop-all (until Resume);
    /// returns those held.
    pub fn hold(&self, tids: &[Tid]) -> Vec<Tid> {
        self.stop(tids, true)
    }

    /// The registers of held tracee `tid`.
    pub fn registers(&self, tid: Tid) -> Option<HeldRegisters> {
        let s = self.owner.get(&tid).map(|s| *s)?;
        let (tx, rx) = mpsc::channel();
        self.send(s, Cmd::Registers { tid, reply: tx });
        rx.recv().ok().flatten()
    }

    fn stop(&self, tids: &[Tid], hold: bool) -> Vec<Tid> {
        let mut per: HashMap<usize, Vec<Tid>> = HashMap::new();
        for &t in tids {
            if let Some(s) = self.owner.get(&t).map(|s| *s) {
                per.entry(s).or_default().push(t);
            }
        }
        // A tracee named twice (a watchpoint of several pieces) stops once:
        // counted twice, the park would wait for a stop that never comes.
        for v in per.values_mut() {
            v.sort_unstable();
            v.dedup();
        }
        let (tx, rx) = mpsc::channel();
        let waiting = per.len();
        for (s, tids) in per {
            self.send(
                s,
                Cmd::Park {
                    tids,
                    hold,
                    reply: tx.clone(),
                },
            );
        }
        (0..waiting)
            .flat_map(|_| rx.recv().unwrap_or_default())
            .collect()
    }

    /// Restarts the tracees of `tids` that are still parked.
    pub fn unpark(&self, tids: &[Tid]) {
        let mut per: HashMap<usize, Vec<Tid>> = HashMap::new();
        for &t in tids {
            if let Some(s) = self.owner.get(&t).map(|s| *s) {
                per.entry(s).or_default().push(t);
            }
        }
        for (s, tids) in per {
            self.send(s, Cmd::Unpark { tids });
        }
    }

    /// Resumes held tracees of `pid` (all held ones when `tids` is empty).
    pub fn resume(&self, pid: Pid, tids: &[Tid]) -> Vec<Tid> {
        if tids.is_empty() {
            return self
                .broadcast(|reply| Cmd::Resume {
                    pid,
                    tids: Vec::new(),
                    reply,
                })
                .into_iter()
                .flatten()
                .collect();
        }
        // Named threads: only their tracers are asked.
        let mut per: HashMap<usize, Vec<Tid>> = HashMap::new();
        for &t in tids {
            if let Some(s) = self.owner.get(&t).map(|s| *s) {
                per.entry(s).or_default().push(t);
            }
        }
        let (tx, rx) = mpsc::channel();
        let waiting = per.len();
        for (s, tids) in per {
            self.send(
                s,
                Cmd::Resume {
                    pid,
                    tids,
                    reply: tx.clone(),
                },
            );
        }
        (0..waiting)
            .flat_map(|_| rx.recv().unwrap_or_default())
            .collect()
    }

    /// Stops every tracee of `pid` except `except` (peer stop after a hit).
    pub fn hold_all(&self, pid: Pid, except: Tid) {
        for s in 0..self.shards.len() {
            self.send(s, Cmd::HoldAll { pid, except });
        }
    }

    /// Detaches every tracee of `pid`, DR7 cleared first. Returns the count.
    ///
    /// Every tracee is stopped (parked) before any is released: a thread
    /// detached at its own stop runs again at once, and on a busy process
    /// those still to stop would wait behind it for the CPU (1,000
    /// spinning threads on 2 CPUs took 3-8 s to detach one by one, against
    /// tens of ms this way).
    pub fn detach(&self, pid: Pid) -> usize {
        let tids: Vec<Tid> = self.states(pid).into_keys().collect();
        if tids.len() > 1 {
            self.park(&tids);
        }
        self.broadcast(|reply| Cmd::Detach { pid, reply })
            .into_iter()
            .sum()
    }

    /// Held / job-control state of every tracee of `pid`.
    pub fn states(&self, pid: Pid) -> HashMap<Tid, TraceeState> {
        self.broadcast(|reply| Cmd::States { pid, reply })
            .into_iter()
            .flatten()
            .collect()
    }

    /// Sends one command per shard and collects one reply from each.
    fn broadcast<R: Send + 'static>(&self, mk: impl Fn(mpsc::Sender<R>) -> Cmd) -> Vec<R> {
        let (tx, rx) = mpsc::channel();
        for s in 0..self.shards.len() {
            self.send(s, mk(tx.clone()));
        }
        (0..self.shards.len())
            .filter_map(|_| rx.recv().ok())
            .collect()
    }

    /// Gives back the tracee map's spare capacity (after a large process
    /// went away).
    pub fn shrink(&self) {
        self.owner.shrink_to_fit();
        self.reach.shrink_to_fit();
    }

    /// True if `tid` is one of our tracees.
    pub fn traces(&self, tid: Tid) -> bool {
        self.owner.contains_key(&tid)
    }
}
