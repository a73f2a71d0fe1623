//! The perf backend's events: collectors and their rings, thread trackers
//! and breakpoints, opened per (thread, CPU) or, on the per-thread path,
//! once per thread with a BPF program. No daemon state lives here (see
//! `mod.rs`); what each event asks is in `attr.rs`, the syscalls in
//! `sys.rs`, the fd budget in `fds.rs`, the rings in `collector.rs`, their
//! records in `record.rs`.
//!
//! Layout (see ARCHITECTURE.md, "Coverage of new threads"):
//! - per CPU `c`, one *collector*: a dummy software event `(pid=-1, cpu=c)`
//!   owning a mmapped ring. Every other event of ours on CPU `c` redirects its
//!   output there with `PERF_EVENT_IOC_SET_OUTPUT`, so the daemon reads
//!   `#cpus` rings, not one per thread.
//! - per tracked thread, per CPU, a *tracker*: a dummy event with `task=1`,
//!   `inherit=1`, `inherit_thread=1`, which produces `PERF_RECORD_FORK/EXIT`
//!   for the thread and, through kernel inheritance, for every thread it
//!   creates later.
//! - per armed (watchpoint, thread), per CPU, a breakpoint event; process-wide
//!   ones are `inherit=1, inherit_thread=1`, so the kernel copies them into a
//!   new thread inside `clone()`, before it runs any instruction.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::errno::Errno;
use perf_event_open_sys::bindings as b;

use super::attr::{self, Inherit};
use super::collector::{self, Ring};
use super::record::Record;
use super::sys::{self, PerfError};
use crate::backend::fds::FdBudget;
use crate::model::{Access, Piece, Tid};

/// What one drain pass read.
#[derive(Debug, Default, Clone, Copy)]
pub struct Drained {
    /// Records of the per-CPU rings: task records, and hits on the per-CPU
    /// path.
    pub ring_records: usize,
    /// Hits of the per-thread path's BPF ring.
    pub ring_hits: usize,
}

/// What the kernel dropped (`GetStats`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lost {
    /// Records a full perf ring dropped (per-CPU path: hits and thread
    /// records; per-thread path: the collectors' task records).
    pub perf_ring: u64,
    /// Hits the per-thread path's program found no room for in its ring.
    pub bpf_ring: u64,
    /// Times an event of ours was throttled (`PERF_RECORD_THROTTLE`).
    pub throttled: u64,
}

/// One breakpoint on one thread: an event per CPU.
#[derive(Debug)]
pub struct ThreadEvents {
    /// The events, one per online CPU.
    pub fds: Vec<OwnedFd>,
    /// Their perf ids (what samples carry), same order.
    pub ids: Vec<u64>,
}

/// Event fds the fd table holds from the start (a 1,000-thread process
/// with trackers and 4 watchpoints on 2 CPUs needs 10,000).
const STARTUP_FD_ROOM: usize = 16 * 1024;

/// The perf backend: collectors, rings, and event constructors.
pub struct Perf {
    cpus: Vec<u32>,
    /// Collector fds by CPU index (owned by `rings`; immutable after new).
    collectors: Vec<RawFd>,
    rings: Mutex<Vec<Ring>>,
    scratch: Mutex<Vec<u8>>,
    fds: Arc<FdBudget>,
    /// Records dropped by a full perf ring, as its `PERF_RECORD_LOST`
    /// records said.
    records_lost: AtomicU64,
    /// Losses reported on the event stream ahead of their
    /// `PERF_RECORD_LOST` records (the events' own counts knew of them
    /// first, [`Perf::unreported_lost`]): those records, when they come,
    /// are not reported again. Behind its lock, `records_lost` moves too.
    lost_ahead: Mutex<u64>,
    /// Samples lost by events already closed, as they counted them
    /// (`attr::READ_FORMAT`), read at close.
    closed_lost: AtomicU64,
    /// Hits the per-thread path's program found no room for.
    bpf_dropped: AtomicU64,
    /// `PERF_RECORD_THROTTLE` records read.
    throttled: AtomicU64,
    /// The per-thread path's ring and programs (`ring/`), or why the
    /// per-CPU path is used.
    path: Result<super::ring::HitRing, String>,
    /// Without privilege: the rings are owned by events on the daemon's
    /// own thread (no event sees every task of a CPU), and the size the
    /// user's locked-memory budget left a ring when smaller than asked.
    unprivileged: (bool, Option<usize>),
}

/// Which way the perf backend opens breakpoints (`wpd --perf-events`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventsPolicy {
    /// Per thread where the kernel allows it (bpf()), else per CPU.
    Auto,
    /// Per thread, or the perf backend does not start.
    PerThread,
    /// One event per thread and CPU, output in per-CPU rings.
    PerCpu,
}

impl std::fmt::Debug for Perf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Perf").field("cpus", &self.cpus).finish()
    }
}

/// The kernel's limit on call-chain entries a sample may ask for
/// (`kernel.perf_event_max_stack`, 127 by default); read once.
pub(super) fn max_stack() -> u16 {
    static MAX: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/perf_event_max_stack")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(127)
    })
}

impl Perf {
    /// Opens one collector ring per online CPU and, unless `policy` says
    /// per CPU, the per-thread path's ring. `ring_bytes`: the size of
    /// either (None: their defaults). Needs CAP_PERFMON (or root).
    pub fn new(
        policy: EventsPolicy,
        ring_bytes: Option<usize>,
        fds: Arc<FdBudget>,
    ) -> Result<Self, PerfError> {
        let path = match policy {
            EventsPolicy::PerCpu => Err("--perf-events per-cpu".to_string()),
            _ => super::ring::HitRing::with_size(ring_bytes.unwrap_or(super::ring::RING_BYTES))
                .map_err(|e| e.to_string()),
        };
        if let (EventsPolicy::PerThread, Err(why)) = (policy, &path) {
            tracing::warn!("per-thread perf events: {why}");
            return Err(PerfError {
                op: "bpf(per-thread perf events)",
                errno: Errno::EPERM,
            });
        }
        let per_thread = path.is_ok();
        let cpus = crate::cpus::online();
        // On the per-thread path the collectors carry the machine's task
        // records only: their size stays. A ring takes locked memory: a user
        // without CAP_IPC_LOCK has `perf_event_mlock_kb` per CPU, then its
        // RLIMIT_MEMLOCK (mmap's EPERM past both, kernel-facts §25.2): every
        // CPU's ring is made smaller, down to one page, rather than none.
        let mut bytes = ring_bytes.filter(|_| !per_thread);
        let rings = loop {
            let rings = cpus
                .iter()
                .map(|&cpu| Ring::open(cpu, per_thread, bytes))
                .collect::<Result<Vec<Ring>, PerfError>>();
            match rings {
                Err(e) if e.errno == Errno::EPERM && e.op.starts_with("mmap") => {
                    let now = bytes.unwrap_or(collector::RING_BYTES);
                    if now <= collector::page_bytes() {
                        return Err(PerfError {
                            op: "mmap(collector ring of one page: the user's locked-memory \
                                 budget, perf_event_mlock_kb per CPU then RLIMIT_MEMLOCK, is \
                                 spent)",
                            errno: e.errno,
                        });
                    }
                    bytes = Some(now / 2);
                }
                r => break r?,
            }
        };
        let collectors = rings.iter().map(|r| r.collector.as_raw_fd()).collect();
        let smallest = rings.iter().map(Ring::data_bytes).min().unwrap_or(0);
        let wanted = ring_bytes.unwrap_or(collector::RING_BYTES);
        let unprivileged = (
            rings.iter().any(|r| r.own),
            (!per_thread && smallest < wanted).then_some(smallest),
        );
        let backend = Perf {
            cpus,
            collectors,
            rings: Mutex::new(rings),
            scratch: Mutex::new(Vec::with_capacity(4096)),
            fds,
            records_lost: AtomicU64::new(0),
            lost_ahead: Mutex::new(0),
            closed_lost: AtomicU64::new(0),
            bpf_dropped: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            path,
            unprivileged,
        };
        backend.fds.set_fixed(backend.collectors.len());
        // Grown once now, the table spares the first attaches their growth
        // and its RCU wait (128 KiB of kernel memory).
        backend.reserve_fds(STARTUP_FD_ROOM);
        Ok(backend)
    }

    /// Online CPUs this backend opens events on.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// The per-thread path's ring, when that path is in use.
    pub fn hit_ring(&self) -> Option<&super::ring::HitRing> {
        self.path.as_ref().ok()
    }

    /// What the per-CPU path runs without, for `events`: no event sees
    /// every task (the rings are the daemon's own), and the ring size the
    /// user's locked-memory budget allowed; empty when privileged.
    pub fn unprivileged_note(&self) -> String {
        let mut v = Vec::new();
        if self.unprivileged.0 {
            v.push(
                "without CAP_PERFMON each CPU's ring is owned by an event on the daemon's own \
                 thread: a process's new threads are covered by the events they inherit, new \
                 processes are found by the /proc scan"
                    .to_string(),
            );
        }
        if let Some(bytes) = self.unprivileged.1 {
            v.push(format!(
                "rings of {} KiB per CPU, what the user's locked-memory budget left \
                 (perf_event_mlock_kb per CPU, then RLIMIT_MEMLOCK)",
                bytes / 1024
            ));
        }
        if let Some(why) = crate::procfs::yama::refusal() {
            v.push(format!(
                "{why}: every thread of the user's other processes is still watched (perf \
                 events ask read access, which Yama leaves alone; threads they create are \
                 covered from their creation), but their hits carry no value and conditions \
                 on them cannot be tested"
            ));
        }
        v.join("; ")
    }

    /// Why the per-CPU path is in use (None: the per-thread one is).
    pub fn per_cpu_reason(&self) -> Option<&str> {
        self.path.as_ref().err().map(|s| s.as_str())
    }

    /// Event fds a breakpoint or tracker takes per thread: 1 on the
    /// per-thread path, one per CPU on the other.
    pub fn fds_per_thread(&self) -> usize {
        if self.path.is_ok() {
            1
        } else {
            self.cpus.len()
        }
    }

    /// Raw fds of the collectors, for polling.
    pub fn collector_fds(&self) -> Vec<RawFd> {
        self.collectors.clone()
    }

    /// Perf fds currently open for events (collectors excluded).
    pub fn open_fds(&self) -> u64 {
        self.fds.open()
    }

    /// What the kernel dropped because a ring was full, with `live` the
    /// fds of the events writing into the perf rings now (breakpoints and
    /// trackers of the per-CPU path; the collectors are added here).
    pub fn lost(&self, live: &mut dyn Iterator<Item = RawFd>) -> Lost {
        // What the events count as lost, the records not yet written
        // included (a full ring says nothing until a record fits again).
        let counted = self
            .collectors
            .iter()
            .copied()
            .chain(live)
            .filter_map(sys::lost)
            .sum::<u64>()
            + self.closed_lost.load(Ordering::Relaxed);
        let reported = self.records_lost.load(Ordering::Relaxed);
        Lost {
            perf_ring: counted.max(reported),
            bpf_ring: self.bpf_dropped.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
        }
    }

    /// Of `counted` (what [`Perf::lost`] found the rings lost), what no
    /// `PERF_RECORD_LOST` record has reported yet and was not reported
    /// ahead before: to report now. A full ring writes its record only in
    /// front of the next record that fits (kernel-facts §16), so the losses
    /// of a ring that fills and then goes quiet would otherwise never reach
    /// the event stream, which would count fewer than `GetStats`.
    pub fn unreported_lost(&self, counted: u64) -> u64 {
        let mut ahead = self.lost_ahead.lock().unwrap();
        let shown = self.records_lost.load(Ordering::Relaxed) + *ahead;
        let more = counted.saturating_sub(shown);
        *ahead += more;
        more
    }

    /// Events writing into the perf rings are being closed: keeps what
    /// they lost.
    pub fn closing<'a>(&self, fds: impl IntoIterator<Item = &'a OwnedFd>) {
        let n: u64 = fds
            .into_iter()
            .filter_map(|f| sys::lost(f.as_raw_fd()))
            .sum();
        self.closed_lost.fetch_add(n, Ordering::Relaxed);
    }

    /// Grows the daemon's fd table at once so that `more` event fds fit
    /// beside those open now ([`FdBudget::reserve`]).
    pub fn reserve_fds(&self, more: usize) {
        self.fds.reserve(self.collectors.first().copied(), more);
    }

    /// Whether `more` event fds for caller `uid` can fit beside the fds
    /// open for callers and the collectors, leaving the headroom (and, but
    /// for root, root's reserve) free ([`FdBudget::fits_for`]).
    pub fn fd_room(&self, uid: u32, more: usize) -> bool {
        self.fds.fits_for(uid, more)
    }

    /// The daemon's fd budget, shared with the other backends.
    pub fn fds(&self) -> &FdBudget {
        &self.fds
    }

    /// Accounts for event fds being closed by the caller.
    pub fn forget_fds(&self, n: usize) {
        self.fds.closed(n);
    }

    /// Opens the thread-tracking events on `tid` (one per CPU).
    pub fn open_tracker(&self, tid: Tid) -> Result<Vec<OwnedFd>, PerfError> {
        let (fds, _) = open_per_cpu(
            tid,
            &self.cpus,
            &self.collectors,
            attr::tracker,
            "perf_event_open(tracker)",
            None,
        )?;
        self.fds.opened(fds.len());
        Ok(fds)
    }

    /// Opens a breakpoint on `tid` (one event per CPU). `inherit`: copied by
    /// the kernel into threads `tid` creates later (never into child
    /// processes), and dropped at exec.
    /// `signal`: the `sig_data` of a breakpoint that signals the thread at
    /// each hit ([`attr::signal_thread`]). `callers` and `regs` as for
    /// [`attr::sampled_breakpoint`].
    #[allow(clippy::too_many_arguments)]
    pub fn open_breakpoint(
        &self,
        tid: Tid,
        piece: Piece,
        access: Access,
        inherit: Inherit,
        (callers, regs): (u16, bool),
        signal: Option<u64>,
        id_sink: &dyn Fn(u64),
    ) -> Result<ThreadEvents, PerfError> {
        let max = max_stack();
        let (fds, ids) = open_per_cpu(
            tid,
            &self.cpus,
            &self.collectors,
            || {
                let mut a = attr::sampled_breakpoint(piece, access, inherit, (callers, max), regs);
                if let Some(d) = signal {
                    attr::signal_thread(&mut a, d);
                }
                a
            },
            "perf_event_open(breakpoint)",
            Some(id_sink),
        )?;
        self.fds.opened(fds.len());
        Ok(ThreadEvents { fds, ids })
    }

    /// Opens a breakpoint on `tid` for every CPU at once (`cpu = -1`) that
    /// runs `prog` at each hit instead of writing to a ring (the per-thread
    /// path, `ring/`). `inherit` as for [`Perf::open_breakpoint`].
    pub fn open_breakpoint_bpf(
        &self,
        tid: Tid,
        piece: Piece,
        access: Access,
        inherit: Inherit,
        prog: &OwnedFd,
        signal: Option<u64>,
    ) -> Result<OwnedFd, PerfError> {
        let fd = open_breakpoint_bpf(tid, piece, access, inherit, prog, signal)?;
        self.fds.opened(1);
        Ok(fd)
    }

    /// Reads every complete record from every ring and hands it to `sink`.
    /// Returns the number of records. Serialised: concurrent callers wait.
    pub fn drain(&self, sink: &mut dyn FnMut(Record)) -> Drained {
        let rings = self.rings.lock().unwrap();
        let mut scratch = self.scratch.lock().unwrap();
        let mut d = Drained::default();
        for ring in rings.iter() {
            d.ring_records += ring.drain(&mut scratch, &mut |r| {
                match r {
                    Record::Lost { count } => {
                        // Reported already, in part or whole: the rest.
                        let mut ahead = self.lost_ahead.lock().unwrap();
                        self.records_lost.fetch_add(count, Ordering::Relaxed);
                        let known = count.min(*ahead);
                        *ahead -= known;
                        if count > known {
                            sink(Record::Lost {
                                count: count - known,
                            })
                        }
                    }
                    Record::Throttle { .. } => {
                        self.throttled.fetch_add(1, Ordering::Relaxed);
                        sink(r)
                    }
                    _ => sink(r),
                }
            });
        }
        if let Ok(hits) = &self.path {
            let (read, dropped) = hits.drain(&mut |h| sink(Record::Hit(h)));
            d.ring_hits = read;
            if dropped > 0 {
                self.bpf_dropped.fetch_add(dropped, Ordering::Relaxed);
                sink(Record::Lost { count: dropped });
            }
        }
        d
    }

    /// [`Perf::drain`], then again until every hit whose record was
    /// reserved in the BPF ring before this call is read (waiting at most
    /// `bound`). A pass stops at a record another CPU's program has
    /// reserved and not yet submitted, and the hits after it wait for the
    /// next pass: a process's last hits among them, read after its exit
    /// had ended its watchpoints, would name none and be lost.
    pub fn drain_through(
        &self,
        sink: &mut dyn FnMut(Record),
        bound: std::time::Duration,
    ) -> Drained {
        let target = self.path.as_ref().ok().map(|h| h.produced());
        let mut d = self.drain(sink);
        let (Some(target), Ok(hits)) = (target, &self.path) else {
            return d;
        };
        let start = std::time::Instant::now();
        let mut passes = 0;
        while hits.consumed() < target && start.elapsed() < bound {
            std::thread::sleep(std::time::Duration::from_micros(50));
            let more = self.drain(sink);
            d.ring_records += more.ring_records;
            d.ring_hits += more.ring_hits;
            passes += 1;
        }
        if passes > 0 {
            tracing::debug!(
                passes,
                waited = ?start.elapsed(),
                behind = target.saturating_sub(hits.consumed()),
                "sync: read past a hit record another CPU was still writing"
            );
        }
        d
    }

    /// Returns once a drain pass in progress (on any thread) has finished:
    /// records it resolved through tables changed before this call are
    /// handled, events included.
    pub fn barrier(&self) {
        drop(self.rings.lock().unwrap());
    }

    /// CPU of each ring, in ring order.
    pub fn ring_cpus(&self) -> Vec<u32> {
        self.rings.lock().unwrap().iter().map(|r| r.cpu).collect()
    }
}

/// Opens the event `attr()` describes on `tid` once per CPU of `cpus`, each
/// writing into that CPU's collector (same order); with `id_sink`, asks
/// each its id and hands it over as soon as it is known (samples may come
/// before this returns). All or nothing: on a refusal, what was opened is
/// closed as the error returns.
fn open_per_cpu(
    tid: Tid,
    cpus: &[u32],
    collectors: &[RawFd],
    attr: impl Fn() -> b::perf_event_attr,
    op: &'static str,
    id_sink: Option<&dyn Fn(u64)>,
) -> Result<(Vec<OwnedFd>, Vec<u64>), PerfError> {
    let mut fds = Vec::with_capacity(cpus.len());
    let mut ids = Vec::with_capacity(cpus.len());
    for &cpu in cpus {
        let fd = sys::open(&mut attr(), tid, cpu as i32, op)?;
        if let Some(sink) = id_sink {
            let id = sys::id(&fd)?;
            sink(id);
            ids.push(id);
        }
        fds.push(fd);
    }
    for (fd, &collector) in fds.iter().zip(collectors) {
        sys::set_output(fd, collector)?;
    }
    Ok((fds, ids))
}

/// See [`Perf::open_breakpoint_bpf`] (without the daemon's fd count);
/// signalling the thread at each hit the program lets through when
/// `signal` gives a `sig_data`.
pub(in crate::backend) fn open_breakpoint_bpf(
    tid: Tid,
    piece: Piece,
    access: Access,
    inherit: Inherit,
    prog: &OwnedFd,
    signal: Option<u64>,
) -> Result<OwnedFd, PerfError> {
    let mut a = attr::program_breakpoint(piece, access, inherit);
    if let Some(d) = signal {
        attr::signal_thread(&mut a, d);
        // Disabled until the program is on it: a store in between would
        // signal the thread with nothing judging it (a condition the
        // program holds would be bypassed).
        a.set_disabled(1);
    }
    let fd = sys::open(&mut a, tid, -1, "perf_event_open(breakpoint)")?;
    sys::set_bpf(&fd, prog)?;
    if signal.is_some() {
        sys::enable(&fd)?;
    }
    Ok(fd)
}

/// The events each path opens, with the syscalls answered by the test
/// (`sys::test::intercept`): no root, no kernel breakpoints needed.
#[cfg(test)]
mod tests {
    use super::super::sys::test::{Made, intercept};
    use super::*;
    use crate::model::WatchLen;

    fn piece() -> Piece {
        Piece {
            addr: 0x7000,
            len: WatchLen::new(8).unwrap(),
        }
    }

    #[test]
    fn the_per_cpu_path_opens_one_event_per_cpu_into_that_cpus_ring() {
        let seen = std::cell::RefCell::new(Vec::new());
        let (r, made) = intercept(
            |_| Ok(()),
            || {
                open_per_cpu(
                    4242,
                    &[0, 1, 3],
                    &[100, 101, 103],
                    || {
                        attr::sampled_breakpoint(
                            piece(),
                            Access::Write,
                            Inherit::Threads,
                            (0, 127),
                            true,
                        )
                    },
                    "perf_event_open(breakpoint)",
                    Some(&|id| seen.borrow_mut().push(id)),
                )
            },
        );
        let (fds, ids) = r.unwrap();
        assert_eq!(fds.len(), 3);
        assert_eq!(*seen.borrow(), ids, "every id handed over");
        let opens: Vec<(i32, i32, RawFd)> = made
            .iter()
            .filter_map(|m| match m {
                Made::Open { attr, pid, cpu, fd } => {
                    assert_eq!(attr.type_, b::PERF_TYPE_BREAKPOINT);
                    assert_eq!((attr.inherit(), attr.inherit_thread()), (1, 1));
                    assert_eq!(attr.remove_on_exec(), 1);
                    Some((*pid, *cpu, *fd))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            opens.iter().map(|o| (o.0, o.1)).collect::<Vec<_>>(),
            [(4242, 0), (4242, 1), (4242, 3)]
        );
        let outputs: Vec<(RawFd, RawFd)> = made
            .iter()
            .filter_map(|m| match m {
                Made::SetOutput { fd, to } => Some((*fd, *to)),
                _ => None,
            })
            .collect();
        assert_eq!(
            outputs,
            opens
                .iter()
                .zip([100, 101, 103])
                .map(|(o, c)| (o.2, c))
                .collect::<Vec<_>>(),
            "each event into its own CPU's collector"
        );
        let id_asks = made.iter().filter(|m| matches!(m, Made::Id { .. })).count();
        assert_eq!(id_asks, 3);
    }

    #[test]
    fn trackers_ask_no_ids_and_a_refusal_is_all_or_nothing() {
        let (r, made) = intercept(
            |_| Ok(()),
            || {
                open_per_cpu(
                    7,
                    &[0, 1],
                    &[100, 101],
                    attr::tracker,
                    "perf_event_open(tracker)",
                    None,
                )
            },
        );
        assert_eq!(r.unwrap().1, Vec::<u64>::new());
        assert!(!made.iter().any(|m| matches!(m, Made::Id { .. })));
        for m in &made {
            if let Made::Open { attr, .. } = m {
                assert_eq!(
                    (attr.task(), attr.inherit(), attr.inherit_thread()),
                    (1, 1, 1)
                );
            }
        }

        // The second CPU's event is refused: the error names the call, and
        // nothing is redirected.
        let mut n = 0;
        let (r, made) = intercept(
            move |m| match m {
                Made::Open { .. } => {
                    n += 1;
                    if n == 2 { Err(Errno::EMFILE) } else { Ok(()) }
                }
                _ => Ok(()),
            },
            || {
                open_per_cpu(
                    7,
                    &[0, 1],
                    &[100, 101],
                    attr::tracker,
                    "perf_event_open(tracker)",
                    None,
                )
            },
        );
        assert_eq!(
            r.unwrap_err(),
            PerfError {
                op: "perf_event_open(tracker)",
                errno: Errno::EMFILE
            }
        );
        assert!(!made.iter().any(|m| matches!(m, Made::SetOutput { .. })));
    }

    #[test]
    fn the_per_thread_path_opens_one_event_on_every_cpu_running_the_program() {
        let prog = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let (r, made) = intercept(
            |_| Ok(()),
            || {
                open_breakpoint_bpf(
                    4242,
                    piece(),
                    Access::ReadWrite,
                    Inherit::ThreadsAndForks,
                    &prog,
                    None,
                )
            },
        );
        let fd = r.unwrap();
        let [
            Made::Open {
                attr,
                pid,
                cpu,
                fd: opened,
            },
            Made::SetBpf { fd: with, prog: p },
        ] = made.as_slice()
        else {
            panic!("{made:?}");
        };
        assert_eq!((*pid, *cpu), (4242, -1), "one event for every CPU");
        assert_eq!((*opened, *with), (fd.as_raw_fd(), fd.as_raw_fd()));
        assert_eq!(*p, prog.as_raw_fd());
        assert_eq!(attr.bp_type, b::HW_BREAKPOINT_RW);
        assert_eq!((attr.inherit(), attr.inherit_thread()), (1, 0), "forks too");
        assert_eq!(attr.sample_type & u64::from(b::PERF_SAMPLE_CALLCHAIN), 0);

        let (r, _) = intercept(
            |m| match m {
                Made::SetBpf { .. } => Err(Errno::EINVAL),
                _ => Ok(()),
            },
            || open_breakpoint_bpf(1, piece(), Access::Write, Inherit::No, &prog, None),
        );
        assert_eq!(r.unwrap_err().op, "PERF_EVENT_IOC_SET_BPF");
    }

    #[test]
    fn a_breakpoint_that_signals_is_enabled_only_once_its_program_is_on() {
        let prog = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let (r, made) = intercept(
            |_| Ok(()),
            || {
                open_breakpoint_bpf(
                    7,
                    piece(),
                    Access::Write,
                    Inherit::ThreadsAndForks,
                    &prog,
                    Some(0x8000_0000_0000_0001),
                )
            },
        );
        let fd = r.unwrap();
        let [
            Made::Open { attr, .. },
            Made::SetBpf { fd: with, .. },
            Made::Enable { fd: enabled },
        ] = made.as_slice()
        else {
            panic!("{made:?}");
        };
        assert_eq!((attr.sigtrap(), attr.disabled()), (1, 1));
        assert_eq!(attr.sig_data, 0x8000_0000_0000_0001);
        assert_eq!((*with, *enabled), (fd.as_raw_fd(), fd.as_raw_fd()));
        // Without a signal the event counts from its open, as before.
        let (_, made) = intercept(
            |_| Ok(()),
            || open_breakpoint_bpf(7, piece(), Access::Write, Inherit::No, &prog, None),
        );
        assert!(
            matches!(made.as_slice(), [Made::Open { attr, .. }, Made::SetBpf { .. }] if attr.disabled() == 0)
        );
    }
}
