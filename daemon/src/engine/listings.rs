//! Listings and counters: watchpoints, processes, threads, stats.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use super::{Core, ProcessView, Stats, ThreadView, WatchView};
use crate::arch;
use crate::backend::RunState;
use crate::error::WpdError;
use crate::model::{Pid, Tid};
use crate::procfs;
use crate::state::Watch;

impl Core {
    pub(super) fn view(&self, w: &Watch) -> WatchView {
        WatchView {
            id: w.id,
            spec: w.spec.clone(),
            process_wide: w.process_wide,
            armed_threads: self.ledger.armed_on(&self.watch_tids(w), w.id) as u32,
            hits: w.hits.load(Ordering::Relaxed),
            created_at_ns: w.created_at_ns,
            backend: w.backend,
            warnings: Vec::new(),
            symbol: w.resolved.clone(),
            filtered: {
                let (filtered, limited) = w.filter.counts();
                let at_trap = self
                    .backends
                    .get(Some(w.backend))
                    .map_or(0, |b| b.filtered_at_trap(w.id));
                (filtered + at_trap, limited)
            },
            // The live ones: each leaves at its exit or exec, which the
            // per-thread path reads in a record; the per-CPU path reads none
            // for a child's exit, so those gone from `/proc` are dropped
            // here (at a listing, never on a fork's path). Listed up to a
            // bound (a fork server may have thousands at once).
            forked_children: {
                let mut f = w.forked.lock().unwrap();
                f.retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
                f.keys().take(1024).copied().collect()
            },
        }
    }

    /// The spec of data watchpoint `id` as it is now (its range and value
    /// type as last resolved).
    pub fn watch_spec(&self, id: crate::model::WatchId) -> Option<crate::model::WatchSpec> {
        self.watches.get(&id).map(|w| w.spec.clone())
    }

    /// Watchpoints (and processes), optionally of one pid, by id.
    pub fn list(&self, pid: Option<Pid>) -> (Vec<WatchView>, Vec<ProcessView>) {
        let mut ws: Vec<WatchView> = self
            .watches
            .iter()
            .filter(|w| pid.is_none_or(|p| w.spec.pid == p))
            .map(|w| self.view(&w))
            .collect();
        ws.sort_by_key(|w| w.id);
        let mut ps: Vec<ProcessView> = self
            .procs
            .iter()
            .filter(|p| pid.is_none_or(|x| p.pid == x))
            .map(|p| ProcessView {
                pid: p.pid,
                backend: p.backend,
                threads: self.ledger.thread_count(p.pid) as u32,
                watchpoints: p.watches.lock().unwrap().len() as u32,
                // Now: an exec changes it.
                comm: crate::procfs::comm(p.pid, p.pid).unwrap_or_else(|| p.comm.clone()),
                attached_at_ns: p.attached_at_ns,
                stops: self
                    .backends
                    .get(Some(p.backend))
                    .map(|b| b.stops_of(p.pid))
                    .unwrap_or_default(),
            })
            .collect();
        ps.sort_by_key(|p| p.pid);
        (ws, ps)
    }

    /// A process as listed.
    pub fn process_view(&self, pid: Pid) -> Option<ProcessView> {
        self.list(Some(pid)).1.into_iter().next()
    }

    /// Threads of an attached process. `probe`: ask the kernel. Blocking.
    pub fn threads(
        &self,
        pid: Pid,
        only: &[Tid],
        probe: bool,
    ) -> Result<Vec<ThreadView>, WpdError> {
        let proc = self
            .procs
            .get(&pid)
            .map(|p| p.clone())
            .ok_or(WpdError::NotAttached(pid))?;
        let backend = self.backends.get(Some(proc.backend))?;
        backend.sync();
        let mut tids = self.ledger.tids(pid);
        if !only.is_empty() {
            let known: HashSet<Tid> = tids.iter().copied().collect();
            if let Some(&t) = only.iter().find(|t| !known.contains(t)) {
                return Err(WpdError::NoSuchThread { pid, tid: t });
            }
            tids = only.to_vec();
        }
        tids.sort_unstable();
        let states = backend.thread_states(pid);
        let mut out = Vec::with_capacity(tids.len());
        for tid in tids {
            if probe
                && let Some(p) = &self.probe
                && let Ok(free) = p.free_slots(tid, arch::current::SLOTS)
            {
                self.ledger.set_probed(tid, free);
            }
            let Some(row) = self.ledger.get(tid) else {
                continue;
            };
            out.push(ThreadView {
                tid,
                parent: row.parent,
                slots: (0..arch::current::SLOTS)
                    .map(|s| row.slot_state(s))
                    .collect(),
                name: procfs::comm(pid, tid).unwrap_or_default(),
                state: states.get(&tid).copied().unwrap_or(RunState::Running),
            });
        }
        Ok(out)
    }

    /// Daemon-wide counters.
    pub fn stats(&self) -> Stats {
        let (mut lost, mut throttled, mut fds) = (0, 0, 0);
        for b in self.backends.usable() {
            let s = b.stats();
            lost += s.lost;
            throttled += s.throttled;
            fds += s.fds;
        }
        Stats {
            processes: self.procs.len() as u32,
            threads: self.ledger.total_threads() as u64,
            watchpoints: self.watches.len() as u32,
            hits: self.hits.load(Ordering::Relaxed),
            kernel_lost: lost,
            kernel_throttled: throttled,
            perf_fds: fds,
            subscribers: self.bus.subscribers(None) as u32,
            subscriber_dropped: self.bus.dropped(None),
            ledger_hold: self.ledger.hold_summary(),
            uptime: self.started.elapsed(),
            journal: self.journal.as_ref().map(|j| j.figures()),
            code_events: self.objects.count() as u32,
            code_event_bytes: self.objects.kernel_bytes(),
            objects: self.objects.totals(),
        }
    }

    /// Fds the daemon holds for callers (every backend's events, uprobes,
    /// programs and maps).
    pub fn caller_fds(&self) -> u64 {
        self.backends.fds().open()
    }

    /// Why the daemon cannot serve every request now, if it cannot: out
    /// of file descriptors (a request that names a process reads `/proc`,
    /// a connection needs one). `None`: it can.
    pub fn degraded(&self) -> Option<String> {
        match std::fs::File::open("/dev/null") {
            Ok(_) => None,
            Err(e) => {
                let errno = nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(0));
                crate::backend::fds::is_out_of_fds(errno).then(|| {
                    format!(
                        "out of file descriptors ({}): {} held for watchpoints and code events, \
                         RLIMIT_NOFILE {}",
                        errno.desc(),
                        self.caller_fds(),
                        crate::backend::fds::nofile_limit()
                    )
                })
            }
        }
    }

    /// The counters one unprivileged caller may see: of the processes
    /// `visible` to it (hits of their current watchpoints) and of its own
    /// subscriptions; daemon-wide figures are left at 0.
    pub fn stats_for(&self, uid: u32, visible: impl Fn(Pid) -> bool) -> Stats {
        let pids: Vec<Pid> = self
            .procs
            .iter()
            .map(|p| p.pid)
            .filter(|&p| visible(p))
            .collect();
        let (mut watchpoints, mut hits) = (0, 0);
        for w in self.watches.iter() {
            if pids.contains(&w.spec.pid) {
                watchpoints += 1;
                hits += w.hits.load(Ordering::Relaxed);
            }
        }
        Stats {
            processes: pids.len() as u32,
            threads: pids
                .iter()
                .map(|&p| self.ledger.thread_count(p) as u64)
                .sum(),
            watchpoints,
            hits,
            subscribers: self.bus.subscribers(Some(uid)) as u32,
            subscriber_dropped: self.bus.dropped(Some(uid)),
            uptime: self.started.elapsed(),
            code_events: self.objects.held_by(uid) as u32,
            code_event_bytes: self.objects.kernel_bytes_of(uid),
            objects: self.objects.totals_for(uid),
            ..Stats::default()
        }
    }
}
