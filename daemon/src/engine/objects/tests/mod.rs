//! Unit tests of object watches, without a kernel: the pure parts, and the
//! core driven through `Host::code_event` and `Host::objects_freed` on the
//! fake backend (`FakeKernel::holding_threads`), the test playing the
//! tracer with records it makes and a [`Armer`] of its own.
//!
//! Watches are set through the real path (`Core::set_object_watch`: the
//! names resolved by `Symbols` in a process the test starts, `sleep`, whose
//! libc exports `malloc` and `free`); expressions are bare registers
//! (`$ret`, `$arg0+8`), which need no DWARF. Each process has its one real
//! thread, and one more the test adds to the ledger ([`OTHER`]): a thread
//! the tracer may or may not reach.
//!
//! What the objects thread does is waited for on a condition with a
//! deadline ([`wait_until`]), never on a sleep.

mod arming;
mod breakpoints;
mod freeing;
mod pending;
mod process;
mod pure;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{CodeSpec, ObjectCountsView, ObjectView};
use crate::backend::fake::FakeKernel;
use crate::backend::{CodeHold, CodeProbe, CodeRecord, Host, StopArmer};
use crate::engine::{Backends, Config, Core, Limits};
use crate::ledger::Outcome;
use crate::ledger::Reservation;
use crate::model::{Access, HitAction, Pid, Range, Scope, Tid, WatchId, WatchSpec};
use crate::state::Watch;

/// The caller every test sets its watches as.
const OWNER: u32 = 0;

/// A second thread of the target, known to the ledger only (no tid the
/// kernel hands out is this high).
const OTHER: Tid = 0x3fff_fff0;

/// An object's base, as a function returns it.
const BASE: u64 = 0x5555_0000_1000;

/// How long the objects thread may take (the machine may be loaded).
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `done` holds, failing with `what` after [`PATIENCE`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A core on a fake kernel that holds threads, and a target process it
/// started (killed on drop).
struct Rig {
    core: Arc<Core>,
    kernel: Arc<FakeKernel>,
    pid: Pid,
    child: std::process::Child,
}

impl Rig {
    /// A rig whose target's ledger has [`OTHER`] too, once attached.
    fn start() -> Rig {
        Rig::over(FakeKernel::holding_threads())
    }

    fn over(kernel: Arc<FakeKernel>) -> Rig {
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("start sleep");
        let pid = child.id() as Pid;
        // Started: its libc mapped and the loader done (it sleeps).
        wait_until("the target sleeps with its libc mapped", || {
            crate::procfs::thread_state(pid, pid) == Some('S')
                && std::fs::read_to_string(format!("/proc/{pid}/maps"))
                    .is_ok_and(|m| m.contains("libc.so"))
        });
        let core = Core::start_config(Config::new(
            Limits::default(),
            Backends::Fake(kernel.clone()),
        ));
        // Its modules read (the executable, libc, the loader): a module
        // still being read is refused ("ask again later"), which a loaded
        // machine may take a while to get past.
        for name in ["malloc", "_dl_debug_state"] {
            wait_until(&format!("the module of {name} is read"), || {
                !matches!(
                    core.symbols.code_site(pid, name),
                    Err(crate::symbols::SymbolError::ModuleLoading { .. })
                )
            });
        }
        Rig {
            core,
            kernel,
            pid,
            child,
        }
    }

    /// Sets an object watch through the core's real path; its view and the
    /// probes it opened.
    fn set(&self, code: CodeSpec) -> (ObjectView, Probes) {
        self.set_as(spec(self.pid), code)
    }

    fn set_as(&self, spec: WatchSpec, code: CodeSpec) -> (ObjectView, Probes) {
        let before = self.kernel.probes(self.pid).len();
        let view = self
            .core
            .set_object_watch(spec, code, OWNER)
            .expect("set the object watch");
        if self.core.ledger.get(OTHER).is_none() {
            assert!(self.core.ledger.add_thread(self.pid, OTHER));
        }
        let opened = self.kernel.probes(self.pid)[before..].to_vec();
        (view, Probes(opened))
    }

    /// A thread of the target stopped at `records`.
    fn stop(&self, tid: Tid, records: &[CodeRecord], armer: &mut Armer) -> CodeHold {
        Host::code_event(&*self.core, self.pid, tid, records, armer)
    }

    /// The view of object watch `id`.
    fn view(&self, id: WatchId) -> ObjectView {
        self.core.object_watch(id).expect("the object watch")
    }

    fn counts(&self, id: WatchId) -> ObjectCountsView {
        self.view(id).counts
    }

    /// The one live object's watchpoint of object watch `id`.
    fn only_child(&self, id: WatchId) -> Arc<Watch> {
        let live = self.view(id).live;
        assert_eq!(live.len(), 1, "live objects of {id:?}: {live:?}");
        self.core
            .watches
            .get(&live[0])
            .expect("its watchpoint")
            .clone()
    }

    /// The slots the ledger holds for watchpoint `id`.
    fn slots(&self, id: WatchId) -> Vec<(Tid, u8)> {
        let mut s = self.core.ledger.slots_on(&[self.pid, OTHER], id);
        s.sort_unstable();
        s
    }

    /// Waits until the objects thread resumed `tid` `n` times in all.
    fn wait_resumed(&self, tid: Tid, n: usize) {
        wait_until(&format!("{tid} is resumed {n} times"), || {
            self.kernel
                .resumed()
                .iter()
                .filter(|(p, t)| *p == self.pid && t == &[tid])
                .count()
                >= n
        });
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The probes one set opened.
#[derive(Debug)]
struct Probes(Vec<CodeProbe>);

impl Probes {
    /// The event's probe.
    fn event(&self) -> &CodeProbe {
        let v: Vec<&CodeProbe> = self.0.iter().filter(|p| !p.first_arg_filter).collect();
        assert_eq!(v.len(), 1, "event probes: {:?}", self.0);
        v[0]
    }

    /// The disarming probe.
    fn disarm(&self) -> &CodeProbe {
        let v: Vec<&CodeProbe> = self.0.iter().filter(|p| p.first_arg_filter).collect();
        assert_eq!(v.len(), 1, "disarming probes: {:?}", self.0);
        v[0]
    }
}

/// A process-wide template, writes of 8 bytes (its range is set per
/// object).
fn spec(pid: Pid) -> WatchSpec {
    WatchSpec {
        pid,
        scope: Scope::Process,
        range: Range {
            addr: 0,
            len: 8,
            pieces: Vec::new(),
        },
        access: Access::Write,
        backend: None,
        action: HitAction::Log,
        only_on_change: false,
        allow_init: false,
        symbol: None,
        backtrace: 0,
        filter: Default::default(),
        condition: None,
        value_type: None,
        lease: 0,
        keep_recent: crate::model::DEFAULT_KEEP_RECENT,
        policy: None,
        follow_forks: false,
        aggregate: None,
        feedback: None,
    }
}

/// The object `malloc` returns, freed by `free`.
fn malloced() -> CodeSpec {
    CodeSpec {
        function: "malloc".into(),
        at_return: true,
        expr: "$ret".into(),
        len: 0,
        disarm_on: Some("free".into()),
        max_live: 0,
        creator_only: false,
        stop: false,
        line: None,
        ignore: 0,
        every: 0,
        pending: false,
    }
}

/// A code breakpoint at `function`.
fn breakpoint(function: &str) -> CodeSpec {
    CodeSpec {
        function: function.into(),
        at_return: false,
        expr: String::new(),
        disarm_on: None,
        stop: true,
        ..malloced()
    }
}

/// A record of probe `key` by thread `tid`: returning `ret`, called with
/// `arg0`.
fn record(pid: Pid, key: u64, tid: Tid, ret: u64, arg0: u64) -> CodeRecord {
    CodeRecord {
        key,
        pid,
        tid,
        ret,
        args: [arg0, 0, 0, 0, 0, 0],
        sp: 0x7ffc_0000_0000,
        ip: 0x7f00_0000_1000,
        freed: false,
    }
}

/// The tracer's side of a stop: programs the threads it reaches,
/// recording what it armed and cleared.
#[derive(Debug, Default)]
struct Armer {
    /// Threads it reaches.
    reach: Vec<Tid>,
    /// Threads where the kernel refuses a breakpoint (ENOSPC).
    full: Vec<Tid>,
    /// What it armed: the watchpoint, its reservations.
    armed: Vec<(WatchId, Vec<Reservation>)>,
    /// The slots it cleared.
    cleared: Vec<(Tid, u8)>,
}

impl Armer {
    fn reaching(reach: &[Tid]) -> Armer {
        Armer {
            reach: reach.to_vec(),
            ..Armer::default()
        }
    }

    /// The slots it cleared, in order.
    fn cleared(&self) -> Vec<(Tid, u8)> {
        let mut s = self.cleared.clone();
        s.sort_unstable();
        s
    }

    /// The slots it armed for `id`.
    fn slots_of(&self, id: WatchId) -> Vec<(Tid, u8)> {
        let mut s: Vec<(Tid, u8)> = self
            .armed
            .iter()
            .filter(|(w, _)| *w == id)
            .flat_map(|(_, r)| r.iter().map(|r| (r.tid, r.slot)))
            .collect();
        s.sort_unstable();
        s
    }
}

impl StopArmer for Armer {
    fn reaches(&self, tid: Tid) -> bool {
        self.reach.contains(&tid)
    }

    fn arm(&mut self, watch: &Watch, res: &[Reservation]) -> Vec<(Reservation, Outcome)> {
        assert!(
            res.iter().all(|r| self.reaches(r.tid)),
            "armed a thread it does not reach: {res:?}"
        );
        self.armed.push((watch.id, res.to_vec()));
        res.iter()
            .map(|r| {
                let o = if self.full.contains(&r.tid) {
                    Outcome::NoSpace
                } else {
                    Outcome::Armed(None)
                };
                (*r, o)
            })
            .collect()
    }

    fn clear(&mut self, slots: &[(Tid, u8)]) {
        assert!(
            slots.iter().all(|(t, _)| self.reaches(*t)),
            "cleared a thread it does not reach: {slots:?}"
        );
        self.cleared.extend_from_slice(slots);
    }
}
