//! The perf backend's drain thread: reads the per-CPU rings and turns
//! records into the ledger's thread lifecycle and into hit events.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::PerfEngine;
use super::record::Record;
use crate::arch;
use crate::backend::Host;
use crate::events::{EventKind, HitEvent};
use crate::model::{BackendKind, Pid, Tid, WatchId};
use crate::procfs;
use crate::state::{Job, Watch};

impl PerfEngine {
    /// Runs until the backend stops: reads the rings when the kernel signals
    /// them (a quarter-full ring), at least every `TRACKED_POLL_MS` on the
    /// per-thread path (`QUIET_POLL_MS` on the per-CPU path) while a
    /// process is tracked or a policy waits for processes, every
    /// `IDLE_POLL_MS` while neither, and every `BUSY_PERIOD` without
    /// waiting while hits keep coming.
    pub(super) fn drain_loop(&self) {
        let mut fds: Vec<libc::pollfd> = self
            .perf
            .collector_fds()
            .into_iter()
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let per_thread = self.perf.hit_ring().is_some();
        fds.push(libc::pollfd {
            fd: self.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        let mut busy = false;
        let mut pruned = std::time::Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            if busy {
                // Hits are flowing: read them in batches every BUSY_PERIOD
                // without polling. On the per-CPU path, any record keeps
                // it busy: the kernel wakes every poller of a ring each
                // time a thread with inherited events on it exits
                // (`perf_event_exit_event` kicks `perf_poll`): polled, a
                // process creating and joining 14,000 threads/s woke this
                // thread 13,000 times/s, each wake-up preempting one of its
                // threads on a busy CPU (a perf context switch out and in).
                std::thread::sleep(BUSY_PERIOD);
            } else {
                // Neither a hit nor a task record wakes the poll until a
                // quarter of a ring is full (a wake-up per hit doubled what
                // a hit costs the writing thread: `wakeup_events = 1` on
                // the per-CPU path, the BPF ring's notification on the
                // per-thread one, see `ring/`): while some process is
                // tracked they are read on a timeout. Policies waiting for
                // processes read the collectors' FORK and exec records on
                // the same timeout. With neither, nothing can come.
                let timeout = if self.trackers.is_empty()
                    && !self.host.upgrade().is_some_and(|h| h.wants_processes())
                {
                    IDLE_POLL_MS
                } else if per_thread {
                    TRACKED_POLL_MS
                } else {
                    QUIET_POLL_MS
                };
                // SAFETY: fds is a valid pollfd array.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
                if fds.last().is_some_and(|w| w.revents & libc::POLLIN != 0) {
                    let mut n = [0u8; 8];
                    // SAFETY: reads 8 bytes into a live buffer from our eventfd.
                    unsafe { libc::read(self.wake.as_raw_fd(), n.as_mut_ptr().cast(), n.len()) };
                }
            }
            let Some(host) = self.host.upgrade() else {
                return;
            };
            let mut values = ValueCache::default();
            // One burst: the journal's writer is woken once per pass.
            let mut read = Default::default();
            host.burst(&mut || {
                read = self
                    .perf
                    .drain(&mut |r| self.on_record(&*host, r, &mut values));
            });
            // On the per-thread path the collectors carry task records only
            // (every fork and exit of the machine on a farm host, a fork
            // server's thousands a second among them): they do not make
            // the drain busy, hits do.
            busy = if per_thread {
                read.ring_hits > 0
            } else {
                read.ring_records > 0
            };
            // The per-CPU path reads no forked child's exit (its trackers
            // follow threads, not forks): the children gone are dropped
            // every second, so that a fork server's leave nothing behind
            // once it stops, and never on a fork's path.
            if !per_thread && !self.forked.is_empty() && pruned.elapsed() >= PRUNE_PERIOD {
                pruned = std::time::Instant::now();
                self.prune_forked(&*host);
            }
        }
    }

    /// The `len` bytes at `addr` at a hit of `(pid, tid)` on `w` whose
    /// registers after the access are `general`: `value` as read, with
    /// what the thread's store wrote put back over it
    /// ([`Stores`](crate::backend::stored::Stores)). The drain does not wait
    /// for a module to load: until it has, the value stays as read.
    fn stored_value(
        &self,
        host: &dyn Host,
        w: &crate::state::Watch,
        (pid, tid): (Pid, Tid),
        general: &libc::user_regs_struct,
        (addr, len): (u64, u32),
        value: Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>, String> {
        let trap = crate::backend::stored::Trap {
            code_of: w.spec.pid,
            pid,
            tid,
            general,
            segment_bases: false,
        };
        self.stores.value(
            host,
            &trap,
            || None,
            (addr, len as usize),
            value,
            std::time::Duration::ZERO,
        )
    }

    /// Forgets the forked children no longer in `/proc`.
    fn prune_forked(&self, host: &dyn Host) {
        let gone: Vec<Pid> = self
            .forked
            .iter()
            .map(|e| *e.key())
            .filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        for p in gone {
            self.forget_forked(host, p);
        }
    }

    pub(super) fn on_record(&self, host: &dyn Host, r: Record, values: &mut ValueCache) {
        let ledger = host.ledger();
        match r {
            Record::Sample {
                id,
                ip,
                pid,
                tid,
                time,
                addr,
                cpu,
                callchain,
                regs,
            } => {
                let Some(key) = self.event_ids.get(&id).map(|v| *v) else {
                    return;
                };
                let Some(w) = host.watch(key.id) else {
                    return;
                };
                let len = w.spec.range.piece(key.piece).len.bytes();
                // Read now, then what the store wrote put back over it.
                let (value, value_read_ns) = values.read(pid, tid, addr, len);
                let value = match regs {
                    Some(r) => {
                        let general = crate::arch::current::perf_regs::from_sample(&r);
                        self.stored_value(host, &w, (pid, tid), &general, (addr, len), value)
                    }
                    None => value,
                };
                self.report(
                    host,
                    &w,
                    Decoded {
                        piece: key.piece,
                        pid,
                        tid,
                        ip,
                        addr,
                        len,
                        time,
                        cpu,
                        value,
                        value_read_ns,
                        callchain,
                    },
                );
            }
            Record::Hit(h) => {
                let Some(w) = host.watch(h.key.id) else {
                    return;
                };
                let len = w.spec.range.piece(h.key.piece).len.bytes();
                let (pid, tid) = match (h.pid, h.tid) {
                    // A thread of a pid namespace nested in the daemon's
                    // (whose own is not the initial one): the program
                    // cannot number it (kernel-facts §12). The process is
                    // the watchpoint's when no forked child carries it;
                    // the thread is not known (0).
                    (0, 0) if w.forked.lock().unwrap().is_empty() => (w.spec.pid, 0),
                    ids => ids,
                };
                // The program read the bytes at the trap: the value the
                // access left. Read now only if it could not.
                let (value, value_read_ns) = match h.value {
                    Ok(bytes) => (
                        Ok(bytes[..len as usize].to_vec()),
                        h.time + self.clock_offset,
                    ),
                    Err(_) => values.read(pid, tid, h.addr, len),
                };
                // Another thread may have stored between the access and the
                // program's read: what this one's store wrote goes back
                // over it.
                let general = crate::arch::current::perf_regs::from_pt_regs(&h.regs);
                let value = self.stored_value(host, &w, (pid, tid), &general, (h.addr, len), value);
                // The program's chain starts with the trap's ip.
                let mut callchain = h.callchain;
                if callchain.first() == Some(&h.ip) {
                    callchain.remove(0);
                }
                self.report(
                    host,
                    &w,
                    Decoded {
                        piece: h.key.piece,
                        pid,
                        tid,
                        ip: h.ip,
                        addr: h.addr,
                        len,
                        time: h.time,
                        cpu: h.cpu,
                        value,
                        value_read_ns,
                        callchain,
                    },
                );
            }
            Record::Fork {
                pid,
                ppid,
                tid,
                ptid,
                time,
            } => {
                if pid != ppid {
                    let carried = self.on_forked(host, pid, ppid, time);
                    if !carried.is_empty() {
                        // Covered from its first instruction by what it
                        // inherited: no new process for the policies.
                        host.process_forked(pid, ppid, &carried, time);
                        // Gone already: its EXIT was read first (see the
                        // threads' case below); forgotten now, or never.
                        if self.early_child_exits.lock().unwrap().take(pid, time) {
                            self.forget_forked(host, pid);
                        }
                    } else if self.perf.hit_ring().is_some() && host.wants_processes() {
                        // A new process: policies may want it (the
                        // per-thread path's collectors see every fork).
                        host.process_started(pid, time);
                    }
                    return;
                }
                if !self.trackers.contains_key(&pid) {
                    return;
                }
                if self.attached_at.get(&pid).is_some_and(|at| time < *at) {
                    // Per-thread path: created before the attach, which
                    // listed it if it was still alive.
                    return;
                }
                // Gone already: its EXIT record was read first (it sits in
                // the ring of the CPU the thread exited on, the FORK in the
                // creator's, and a pass reads one ring after the other).
                let exited = self.early_exits.lock().unwrap().take(tid, time);
                if let Some(row) = ledger.on_fork(pid, ptid, tid, time) {
                    if !self.trackers.contains_key(&pid) {
                        // Detached between the check above and the row's
                        // insertion: a detach forgets the ledger's rows after
                        // it drops the trackers, so the row is this one's to
                        // take back.
                        ledger.remove_process(pid);
                        return;
                    }
                    // Certain and uncertain ones: the reconcile step arms any
                    // uncertain one that was not inherited.
                    let mut watchpoints: Vec<WatchId> = (0..arch::current::SLOTS)
                        .filter(|s| (row.ours | row.uncertain) & (1 << s) != 0)
                        .map(|s| row.key(s).id)
                        .collect();
                    watchpoints.sort_unstable();
                    watchpoints.dedup();
                    host.publish(EventKind::ThreadStarted {
                        pid,
                        tid,
                        parent: ptid,
                        watchpoints,
                    });
                    if exited {
                        ledger.remove_thread(tid);
                        host.publish(EventKind::ThreadExited { pid, tid });
                    } else {
                        if row.uncertain != 0 || missing_wide(host, pid, &row) {
                            host.schedule(Job::Reconcile(pid));
                        }
                        if host.has_named(pid) {
                            host.schedule(Job::Named(pid, tid));
                        }
                    }
                }
            }
            Record::Exit { pid, tid, time } => {
                if pid == tid && self.forget_forked(host, pid) {
                    return;
                }
                if pid == tid && !self.trackers.contains_key(&pid) {
                    // A forked child whose FORK record is not read yet (a
                    // tracked process's threads are the ledger's).
                    self.early_child_exits.lock().unwrap().insert(pid, time);
                    return;
                }
                if let Some(row) = ledger.get(tid)
                    && row.pid == pid
                {
                    ledger.remove_thread(tid);
                    host.publish(EventKind::ThreadExited { pid, tid });
                    if ledger.thread_count(pid) == 0 {
                        host.schedule(Job::CheckLost(pid));
                    }
                } else if self.trackers.contains_key(&pid) {
                    self.early_exits.lock().unwrap().insert(tid, time);
                }
            }
            Record::Comm { pid, tid, name } => host.renamed(pid, tid, &name),
            Record::Exec {
                pid,
                tid,
                time,
                name,
            } => {
                host.renamed(pid, tid, &name);
                // The stores found in a watched process's old program (the
                // collectors see every exec of the machine: only those).
                if self.trackers.contains_key(&pid) {
                    self.stores.forget(pid);
                }
                // A forked child's inherited breakpoints go at its exec
                // (remove_on_exec): it is a process of its own from now.
                self.forget_forked(host, pid);
                if host.wants_processes() {
                    host.process_started(pid, time);
                }
                let before_attach = self.attached_at.get(&pid).is_some_and(|at| time < *at);
                if self.trackers.contains_key(&pid) && !before_attach {
                    host.schedule(Job::Exec(pid));
                }
            }
            Record::Lost { count } => {
                tracing::warn!(count, "kernel dropped records: ring full");
                host.publish(EventKind::RecordsLost { count });
            }
            Record::Throttle { id } => {
                let watch = self.event_ids.get(&id).map(|k| k.id);
                tracing::warn!(
                    ?watch,
                    "the kernel throttled a perf event (perf_event_max_sample_rate): its hits \
                     until the next tick are not recorded"
                );
            }
        }
    }
}

/// A hit as either path decoded it, before its watchpoint's filter.
struct Decoded {
    piece: u8,
    pid: Pid,
    tid: Tid,
    ip: u64,
    addr: u64,
    len: u32,
    /// Kernel CLOCK_MONOTONIC ns.
    time: u64,
    cpu: u32,
    value: Result<Vec<u8>, String>,
    value_read_ns: u64,
    callchain: Vec<u64>,
}

impl PerfEngine {
    /// Judges a hit of `w` by its filter and publishes it if reported.
    fn report(&self, host: &dyn Host, w: &Watch, d: Decoded) {
        // What the program judged at the trap is not judged again: the rate
        // limit alone is left (it is on what is reported).
        let rate_only;
        let filter = if self.judge_of(w).is_some() {
            rate_only = crate::filter::HitFilter {
                max_per_second: w.spec.filter.max_per_second,
                ..Default::default()
            };
            &rate_only
        } else {
            &w.spec.filter
        };
        let rate_limited_before = match w.filter.judge(
            filter,
            d.value.as_ref().ok().map(|v| &v[..]),
            crate::clock::monotonic_ns(),
        ) {
            crate::filter::Verdict::Report { limited_before } => limited_before,
            _ => return,
        };
        host.count_hit(w);
        let callchain_note = (w.spec.backtrace > 0 && d.callchain.is_empty())
            .then_some(crate::events::NO_FRAME_POINTER);
        host.publish(EventKind::Hit(HitEvent {
            id: w.id,
            piece: d.piece,
            pid: d.pid,
            tid: d.tid,
            ip: d.ip,
            addr: d.addr,
            len: d.len,
            access: w.spec.access,
            value: d.value,
            time_ns: d.time + self.clock_offset,
            value_read_ns: d.value_read_ns,
            cpu: d.cpu,
            stopped: false,
            old_value: None,
            backend: BackendKind::Perf,
            image: host.image(d.pid),
            callchain: d.callchain,
            callchain_note,
            rate_limited_before,
            names: None,
            value_type: None,
        }));
    }

    /// Forgets a forked child that exited or called exec; true if it was
    /// one.
    fn forget_forked(&self, host: &dyn Host, pid: Pid) -> bool {
        let Some((_, ids)) = self.forked.remove(&pid) else {
            return false;
        };
        for id in ids {
            if let Some(w) = host.watch(id) {
                w.forked.lock().unwrap().remove(&pid);
            }
        }
        host.forked_child_gone(pid);
        true
    }

    /// Process `pid` was forked by `ppid`: if `ppid` carries watchpoints
    /// that follow forks (its own, or inherited as a forked child itself),
    /// the kernel copied them into `pid` inside fork(); record that, from
    /// the record alone (no `/proc` read on a fork's path), and return
    /// them.
    fn on_forked(&self, host: &dyn Host, pid: Pid, ppid: Pid, time: u64) -> Vec<WatchId> {
        let mut carried: Vec<WatchId> = Vec::new();
        if self.trackers.contains_key(&ppid)
            && self.attached_at.get(&ppid).is_none_or(|at| time >= *at)
        {
            carried.extend(
                host.wide_watches(ppid)
                    .iter()
                    .filter(|w| w.spec.follow_forks)
                    .map(|w| w.id),
            );
        }
        if let Some(up) = self.forked.get(&ppid) {
            carried.extend(up.iter().copied());
        }
        if carried.is_empty() {
            return carried;
        }
        carried.sort_unstable();
        carried.dedup();
        for id in &carried {
            if let Some(w) = host.watch(*id) {
                w.forked.lock().unwrap().insert(pid, time);
                w.forked_total
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        // Children that exited unseen (the per-CPU path reads no record of
        // their exit) are dropped now and then.
        if self.forked.len() >= 4096 {
            self.prune_forked(host);
        }
        self.forked.insert(pid, carried.clone());
        carried
    }
}

/// How often the per-CPU path forgets forked children that are gone.
const PRUNE_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a new thread lacks one of its process's process-wide
/// watchpoints.
fn missing_wide(host: &dyn Host, pid: Pid, row: &crate::ledger::ThreadSlots) -> bool {
    host.wide_watches(pid)
        .iter()
        .any(|w| row.mask_of(w.id).count_ones() as usize != w.spec.range.slots())
}

/// Pause between ring reads while records keep coming.
const BUSY_PERIOD: std::time::Duration = std::time::Duration::from_millis(1);

/// Longest wait for records between two reads while a process is tracked
/// on the per-CPU path: what a first hit may wait.
const QUIET_POLL_MS: i32 = 2;

/// The same on the per-thread path: what a first hit, a new thread's row,
/// a forked child's exit or a policy's new process may wait. Each pass is a
/// wake-up of the daemon that reads every task record of the machine: at
/// 2 ms, a daemon tracking one idle process spent 23–25 ms of CPU a second
/// and woke 520 times; at 10 ms, 9 ms and 134 (docs/benchmarks.md, "Drain
/// wake-ups"). Hits flowing are read every `BUSY_PERIOD`.
const TRACKED_POLL_MS: i32 = 10;

/// Longest wait when no process uses the perf backend (a safety net).
const IDLE_POLL_MS: i32 = 1000;

/// EXIT records of threads whose FORK record has not been read yet, by tid
/// (exit time). Records of different CPUs' rings are read one ring after
/// the other, so a thread that lives for microseconds on another CPU than
/// its creator can show its exit first: without this, a churning process
/// left a fifth of its threads in the ledger forever (5,500 rows for 5 live
/// threads after 2 s of 2 creators). Kept for [`EarlyExits::KEEP_NS`].
#[derive(Default)]
pub struct EarlyExits {
    by_tid: std::collections::HashMap<Tid, u64>,
    order: std::collections::VecDeque<(u64, Tid)>,
}

impl EarlyExits {
    /// How long an early EXIT waits for its FORK (kernel clock); rings are
    /// drained every few ms.
    const KEEP_NS: u64 = 2_000_000_000;

    pub fn insert(&mut self, tid: Tid, exit_ns: u64) {
        while let Some(&(t, old)) = self.order.front() {
            if t.saturating_add(Self::KEEP_NS) >= exit_ns {
                break;
            }
            self.order.pop_front();
            if self.by_tid.get(&old) == Some(&t) {
                self.by_tid.remove(&old);
            }
        }
        self.by_tid.insert(tid, exit_ns);
        self.order.push_back((exit_ns, tid));
    }

    /// Whether the thread `tid` created at `fork_ns` has exited already
    /// (an exit of an older thread with the same tid does not count).
    pub fn take(&mut self, tid: Tid, fork_ns: u64) -> bool {
        if self.by_tid.is_empty() {
            return false;
        }
        match self.by_tid.get(&tid) {
            Some(&exit_ns) if exit_ns >= fork_ns => {
                self.by_tid.remove(&tid);
                true
            }
            _ => false,
        }
    }
}

/// Values read during one drain pass, by (pid, address, length). The perf
/// backend reads a hit's value after the fact, when the daemon handles the
/// record (`value_read_ns` says when), so every hit on the same bytes in one
/// pass would read the same memory within microseconds: one
/// `process_vm_readv` serves them all. At high hit rates that read is the
/// largest part of the daemon's work per hit.
#[derive(Default)]
pub struct ValueCache {
    read: Vec<ReadValue>,
}

/// (pid, address, length), what reading it gave, and when (Unix ns).
type ReadValue = ((Pid, u64, u32), Result<Vec<u8>, String>, u64);

impl ValueCache {
    /// Distinct (pid, address, length) kept per pass; a pass over more
    /// watched ranges than this reads the others every time.
    const CAP: usize = 64;

    fn read(&mut self, pid: Pid, via: Tid, addr: u64, len: u32) -> (Result<Vec<u8>, String>, u64) {
        let key = (pid, addr, len);
        if let Some((_, v, ns)) = self.read.iter().find(|(k, _, _)| *k == key) {
            return (v.clone(), *ns);
        }
        let v = procfs::read_memory(pid, via, addr, len as usize);
        let ns = crate::clock::realtime_ns();
        if self.read.len() < Self::CAP {
            self.read.push((key, v.clone(), ns));
        }
        (v, ns)
    }
}

#[cfg(test)]
mod tests {
    use super::EarlyExits;

    #[test]
    fn early_exit_matches_only_its_own_fork() {
        let mut e = EarlyExits::default();
        e.insert(7, 1_000);
        // An older thread that had the same tid (created before, exited
        // before): not this one.
        assert!(!e.take(8, 500));
        // The thread created at 900 and gone at 1,000.
        assert!(e.take(7, 900));
        // Taken once.
        assert!(!e.take(7, 900));
        // A fork after the recorded exit is a new thread reusing the tid.
        e.insert(9, 2_000);
        assert!(!e.take(9, 2_500));
    }

    #[test]
    fn early_exits_expire() {
        let mut e = EarlyExits::default();
        e.insert(1, 0);
        e.insert(2, EarlyExits::KEEP_NS + 1);
        assert!(!e.take(1, 0), "expired when a later exit came");
        assert!(e.take(2, 1));
        assert!(e.order.len() <= 1);
    }
}
