//! The perf backend's kernel interface: hardware-breakpoint events per
//! (thread, CPU), thread-tracking dummy events, one sample ring per CPU, and
//! the records read from them. No daemon state lives here (see `mod.rs`).
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

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use perf_event_open_sys as sys;
use sys::bindings as b;

use crate::model::{Access, Piece, Tid, WatchLen};

/// Sample fields of every event. They share rings, so the fields every
/// record carries must agree (`sample_id_all` appends the same trailer to
/// FORK, EXIT and COMM records); a breakpoint of a watchpoint asking for a
/// backtrace adds `PERF_SAMPLE_CALLCHAIN`, which only samples carry, last,
/// so a sample's length tells whether it has one.
const SAMPLE_TYPE: u64 = (b::PERF_SAMPLE_IDENTIFIER
    | b::PERF_SAMPLE_IP
    | b::PERF_SAMPLE_TID
    | b::PERF_SAMPLE_TIME
    | b::PERF_SAMPLE_ADDR
    | b::PERF_SAMPLE_CPU) as u64;

/// Data pages per CPU ring (power of two). 512 × 4 KiB = 2 MiB per CPU,
/// about 37,000 hit records of 56 bytes.
const RING_DATA_PAGES: usize = 512;

/// A decoded record from a ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A breakpoint fired.
    Sample {
        /// Primary event id (the event we opened, also for inherited copies).
        id: u64,
        /// Instruction pointer after the access.
        ip: u64,
        /// Process.
        pid: i32,
        /// Thread.
        tid: i32,
        /// CLOCK_MONOTONIC nanoseconds.
        time: u64,
        /// Configured breakpoint address.
        addr: u64,
        /// CPU.
        cpu: u32,
        /// The user call chain (`PERF_SAMPLE_CALLCHAIN`, breakpoints of
        /// watchpoints asking for a backtrace): return addresses of the
        /// callers, innermost first (the sample's own ip and the kernel's
        /// context markers left out).
        callchain: Vec<u64>,
    },
    /// A breakpoint of the per-thread path fired (its program's record).
    Hit(super::ring::RingHit),
    /// A task was created (thread or process).
    Fork {
        /// Process of the new task.
        pid: i32,
        /// Process of the creator.
        ppid: i32,
        /// New task.
        tid: i32,
        /// Creating thread.
        ptid: i32,
        /// CLOCK_MONOTONIC nanoseconds, emitted after inheritance.
        time: u64,
    },
    /// A task exited.
    Exit {
        /// Process.
        pid: i32,
        /// Thread.
        tid: i32,
        /// CLOCK_MONOTONIC nanoseconds.
        time: u64,
    },
    /// A process called exec (its breakpoints are gone: `remove_on_exec`).
    Exec {
        /// Process.
        pid: i32,
        /// Thread that called exec (now the leader).
        tid: i32,
        /// CLOCK_MONOTONIC nanoseconds (from the `sample_id_all` trailer).
        time: u64,
        /// The new program's name.
        name: String,
    },
    /// A thread was renamed (`prctl(PR_SET_NAME)`, `pthread_setname_np`).
    Comm {
        /// Process.
        pid: i32,
        /// Thread.
        tid: i32,
        /// Its new name.
        name: String,
    },
    /// The kernel dropped records: ring full.
    Lost {
        /// How many.
        count: u64,
    },
}

/// A kernel refusal from a perf syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfError {
    /// Which call.
    pub op: &'static str,
    /// The errno.
    pub errno: Errno,
}

/// One breakpoint on one thread: an event per CPU.
#[derive(Debug)]
pub struct ThreadEvents {
    /// The events, one per online CPU.
    pub fds: Vec<OwnedFd>,
    /// Their perf ids (what samples carry), same order.
    pub ids: Vec<u64>,
}

struct Ring {
    cpu: u32,
    collector: OwnedFd,
    base: *mut u8,
    len: usize,
    data_off: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by the Ring and only accessed under the
// backend's ring mutex.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len come from a successful mmap of this ring.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
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
    open_fds: AtomicU64,
    lost: AtomicU64,
    /// Highest fd number the process's fd table is known to hold (it never
    /// shrinks); see [`Perf::reserve_fds`].
    fd_room: AtomicU64,
    /// Fds perf events leave free under `RLIMIT_NOFILE` for everything else
    /// (connections above all); see [`Perf::set_fd_headroom`].
    headroom: AtomicU64,
    /// The per-thread path's ring and programs (`ring.rs`), or why the
    /// per-CPU path is used.
    path: Result<super::ring::HitRing, String>,
}

/// Who gets a copy of a breakpoint the kernel makes at clone or fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inherit {
    /// Nobody: the thread's own.
    No,
    /// Threads it creates (`inherit`, `inherit_thread`): process-wide.
    Threads,
    /// Threads and forked children (`inherit` alone): `follow_forks`.
    ThreadsAndForks,
}

impl Inherit {
    fn set(self, a: &mut b::perf_event_attr) {
        match self {
            Inherit::No => {}
            Inherit::Threads => {
                a.set_inherit(1);
                a.set_inherit_thread(1);
            }
            Inherit::ThreadsAndForks => a.set_inherit(1),
        }
    }
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

fn base_attr() -> b::perf_event_attr {
    let mut a = b::perf_event_attr {
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        ..Default::default()
    };
    a.sample_type = SAMPLE_TYPE;
    a.set_sample_id_all(1);
    a.set_exclude_kernel(1);
    a.set_exclude_hv(1);
    a.set_use_clockid(1);
    a.clockid = libc::CLOCK_MONOTONIC;
    a
}

pub(in crate::backend) fn open(
    attr: &mut b::perf_event_attr,
    pid: i32,
    cpu: i32,
    op: &'static str,
) -> Result<OwnedFd, PerfError> {
    // SAFETY: attr is a fully initialised perf_event_attr of the right size.
    let fd = unsafe {
        sys::perf_event_open(
            attr,
            pid,
            cpu,
            -1,
            libc::c_ulong::from(b::PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        return Err(PerfError {
            op,
            errno: Errno::last(),
        });
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ioctl_result(r: libc::c_int, op: &'static str) -> Result<(), PerfError> {
    if r < 0 {
        Err(PerfError {
            op,
            errno: Errno::last(),
        })
    } else {
        Ok(())
    }
}

/// The daemon's soft `RLIMIT_NOFILE` (unlimited reads as `u64::MAX`).
pub fn nofile_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(u64::MAX, |(soft, _)| soft)
}

/// How many fds the daemon has open now (`/proc/self/fd`, less the one
/// reading it): read only on the way out of a refused request.
pub fn open_fd_count() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| (d.count() as u64).saturating_sub(1))
}

impl Perf {
    /// Opens one collector ring per online CPU and, unless `policy` says
    /// per CPU, the per-thread path's ring. Needs CAP_PERFMON (or root).
    pub fn new(policy: EventsPolicy) -> Result<Self, PerfError> {
        let path = match policy {
            EventsPolicy::PerCpu => Err("--perf-events per-cpu".to_string()),
            _ => super::ring::HitRing::new().map_err(|e| e.to_string()),
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
        let page = page_size();
        let mut rings = Vec::with_capacity(cpus.len());
        for &cpu in &cpus {
            let mut a = base_attr();
            a.type_ = b::PERF_TYPE_SOFTWARE;
            a.config = u64::from(b::PERF_COUNT_SW_DUMMY);
            // Wake the reader when a quarter of the ring is full; the drain
            // loop also polls on a short timeout for latency.
            a.set_watermark(1);
            a.__bindgen_anon_2.wakeup_watermark = (RING_DATA_PAGES * page / 4) as u32;
            if per_thread {
                // No per-thread trackers on this path: the collectors see
                // every task's FORK, EXIT and COMM on their CPU (the drain
                // keeps those of tracked processes).
                a.set_task(1);
                a.set_comm(1);
                a.set_comm_exec(1);
            }
            let collector = open(&mut a, -1, cpu as i32, "perf_event_open(collector)")?;
            let len = (RING_DATA_PAGES + 1) * page;
            // SAFETY: mapping a perf ring of 1 + 2^n pages on our own fd.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    collector.as_raw_fd(),
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(PerfError {
                    op: "mmap(collector ring)",
                    errno: Errno::last(),
                });
            }
            let meta = base as *const b::perf_event_mmap_page;
            // SAFETY: the first page is the metadata page.
            let (data_off, data_size) = unsafe {
                let off = std::ptr::read_volatile(&(*meta).data_offset) as usize;
                let size = std::ptr::read_volatile(&(*meta).data_size) as usize;
                if size == 0 {
                    (page, RING_DATA_PAGES * page)
                } else {
                    (off, size)
                }
            };
            rings.push(Ring {
                cpu,
                collector,
                base: base.cast(),
                len,
                data_off,
                data_size,
            });
        }
        let collectors = rings.iter().map(|r| r.collector.as_raw_fd()).collect();
        let backend = Perf {
            cpus,
            collectors,
            rings: Mutex::new(rings),
            scratch: Mutex::new(Vec::with_capacity(4096)),
            open_fds: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            fd_room: AtomicU64::new(0),
            headroom: AtomicU64::new(0),
            path,
        };
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
        self.open_fds.load(Ordering::Relaxed)
    }

    /// Records the kernel dropped because a ring was full.
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// Grows the daemon's fd table at once so that `more` event fds fit
    /// beside those open now. The kernel grows the table on demand by
    /// doubling, and every growth waits for an RCU grace period
    /// (`expand_files` → `synchronize_rcu`): 10-18 ms each on busy CPUs,
    /// five or six of them while attaching 1,000 threads on 2 CPUs, which
    /// was most of that attach's time (`perf record -e sched:sched_switch
    /// -g`). One growth instead, by duplicating a descriptor to the highest
    /// number needed and closing it. Best effort, within `RLIMIT_NOFILE`.
    pub fn reserve_fds(&self, more: usize) {
        // Fds are allocated lowest-first: the next ones follow the event fds
        // and collectors already open, plus the daemon's own (sockets,
        // eventfds, files), generously counted.
        let mut want = self.open_fds() + self.collectors.len() as u64 + 256 + more as u64;
        let room = self.fd_room.load(Ordering::Relaxed);
        if want <= room {
            return; // the common case: no syscall
        }
        want = want.min(nofile_limit().saturating_sub(1));
        if want <= room {
            return;
        }
        let Some(&src) = self.collectors.first() else {
            return;
        };
        // SAFETY: duplicates our own collector fd to the lowest free number
        // >= `want`; the copy is closed at once.
        let fd = unsafe { libc::fcntl(src, libc::F_DUPFD_CLOEXEC, want as libc::c_int) };
        if fd >= 0 {
            // SAFETY: `fd` was just created here and is not shared.
            unsafe { libc::close(fd) };
            self.fd_room.fetch_max(fd as u64, Ordering::Relaxed);
        }
    }

    /// Whether `more` event fds can fit beside the event fds and collectors
    /// open now, leaving the headroom free, under the soft `RLIMIT_NOFILE`;
    /// false when they cannot. The daemon's other fds are not counted: the
    /// headroom is for them, and the kernel's EMFILE stays the final word.
    pub fn fd_room(&self, more: usize) -> bool {
        let open = self.open_fds() + self.collectors.len() as u64;
        open.saturating_add(more as u64)
            .saturating_add(self.headroom.load(Ordering::Relaxed))
            <= nofile_limit()
    }

    /// Sets the fds perf events never take: the daemon's connections
    /// (their limits, so that clients can always reach a daemon whose
    /// watchpoints fill its fd limit) and its own files.
    pub fn set_fd_headroom(&self, fds: u64) {
        self.headroom.store(fds, Ordering::Relaxed);
    }

    /// The headroom set by [`Perf::set_fd_headroom`].
    pub fn fd_headroom(&self) -> u64 {
        self.headroom.load(Ordering::Relaxed)
    }

    /// Accounts for event fds being closed by the caller.
    pub fn forget_fds(&self, n: usize) {
        self.open_fds.fetch_sub(n as u64, Ordering::Relaxed);
    }

    fn attach_to_rings(&self, fds: &[OwnedFd]) -> Result<(), PerfError> {
        for (fd, &collector) in fds.iter().zip(self.collectors.iter()) {
            // SAFETY: both fds are perf events of ours on the same CPU; the
            // collector lives as long as the backend.
            let r = unsafe { sys::ioctls::SET_OUTPUT(fd.as_raw_fd(), collector) };
            ioctl_result(r, "PERF_EVENT_IOC_SET_OUTPUT")?;
        }
        Ok(())
    }

    /// Opens the thread-tracking events on `tid` (one per CPU).
    pub fn open_tracker(&self, tid: Tid) -> Result<Vec<OwnedFd>, PerfError> {
        let mut fds = Vec::with_capacity(self.cpus.len());
        for &cpu in &self.cpus {
            let mut a = base_attr();
            a.type_ = b::PERF_TYPE_SOFTWARE;
            a.config = u64::from(b::PERF_COUNT_SW_DUMMY);
            a.set_task(1);
            a.set_comm(1);
            a.set_comm_exec(1);
            a.set_inherit(1);
            a.set_inherit_thread(1);
            fds.push(open(&mut a, tid, cpu as i32, "perf_event_open(tracker)")?);
        }
        self.attach_to_rings(&fds)?;
        self.open_fds.fetch_add(fds.len() as u64, Ordering::Relaxed);
        Ok(fds)
    }

    /// Opens a breakpoint on `tid` (one event per CPU). `inherit`: copied by
    /// the kernel into threads `tid` creates later (never into child
    /// processes), and dropped at exec.
    pub fn open_breakpoint(
        &self,
        tid: Tid,
        piece: Piece,
        access: Access,
        inherit: Inherit,
        callers: u16,
        id_sink: &dyn Fn(u64),
    ) -> Result<ThreadEvents, PerfError> {
        let mut fds = Vec::with_capacity(self.cpus.len());
        let mut ids = Vec::with_capacity(self.cpus.len());
        for &cpu in &self.cpus {
            let mut a = breakpoint_attr(piece.addr, piece.len, access);
            a.__bindgen_anon_1.sample_period = 1;
            if callers > 0 {
                // The kernel walks the user stack's frame pointers at the
                // trap; its chain starts with the sample's ip.
                a.sample_type |= u64::from(b::PERF_SAMPLE_CALLCHAIN);
                a.set_exclude_callchain_kernel(1);
                a.sample_max_stack = (callers + 1).min(max_stack());
            }
            a.set_remove_on_exec(1);
            inherit.set(&mut a);
            let fd = open(&mut a, tid, cpu as i32, "perf_event_open(breakpoint)")?;
            let mut id = 0u64;
            // SAFETY: fd is a perf event; id is a valid out pointer.
            ioctl_result(
                unsafe { sys::ioctls::ID(fd.as_raw_fd(), &mut id) },
                "PERF_EVENT_IOC_ID",
            )?;
            id_sink(id);
            ids.push(id);
            fds.push(fd);
        }
        self.attach_to_rings(&fds)?;
        self.open_fds.fetch_add(fds.len() as u64, Ordering::Relaxed);
        Ok(ThreadEvents { fds, ids })
    }

    /// Opens a breakpoint on `tid` for every CPU at once (`cpu = -1`) that
    /// runs `prog` at each hit instead of writing to a ring (the per-thread
    /// path, `ring.rs`). `inherit` as for [`Perf::open_breakpoint`].
    pub fn open_breakpoint_bpf(
        &self,
        tid: Tid,
        piece: Piece,
        access: Access,
        inherit: Inherit,
        prog: &OwnedFd,
    ) -> Result<OwnedFd, PerfError> {
        let fd = open_breakpoint_bpf(tid, piece, access, inherit, prog)?;
        self.open_fds.fetch_add(1, Ordering::Relaxed);
        Ok(fd)
    }

    /// Reads every complete record from every ring and hands it to `sink`.
    /// Returns the number of records. Serialised: concurrent callers wait.
    pub fn drain(&self, sink: &mut dyn FnMut(Record)) -> usize {
        let rings = self.rings.lock().unwrap();
        let mut scratch = self.scratch.lock().unwrap();
        let mut n = 0;
        for ring in rings.iter() {
            n += drain_ring(ring, &mut scratch, &mut |r| {
                if let Record::Lost { count } = r {
                    self.lost.fetch_add(count, Ordering::Relaxed);
                }
                sink(r)
            });
        }
        if let Ok(hits) = &self.path {
            let (read, dropped) = hits.drain(&mut |h| sink(Record::Hit(h)));
            n += read;
            if dropped > 0 {
                self.lost.fetch_add(dropped, Ordering::Relaxed);
                sink(Record::Lost { count: dropped });
            }
        }
        n
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

/// See [`Perf::open_breakpoint_bpf`] (without the daemon's fd count).
pub(in crate::backend) fn open_breakpoint_bpf(
    tid: Tid,
    piece: Piece,
    access: Access,
    inherit: Inherit,
    prog: &OwnedFd,
) -> Result<OwnedFd, PerfError> {
    let mut a = breakpoint_attr(piece.addr, piece.len, access);
    a.__bindgen_anon_1.sample_period = 1;
    a.set_remove_on_exec(1);
    inherit.set(&mut a);
    let fd = open(&mut a, tid, -1, "perf_event_open(breakpoint)")?;
    // SAFETY: PERF_EVENT_IOC_SET_BPF takes the program's fd by value.
    let r = unsafe { sys::ioctls::SET_BPF(fd.as_raw_fd(), prog.as_raw_fd() as u32) };
    ioctl_result(r, "PERF_EVENT_IOC_SET_BPF")?;
    Ok(fd)
}

pub(in crate::backend) fn breakpoint_attr(
    addr: u64,
    len: WatchLen,
    access: Access,
) -> b::perf_event_attr {
    let mut a = base_attr();
    a.type_ = b::PERF_TYPE_BREAKPOINT;
    a.bp_type = match access {
        Access::Write => b::HW_BREAKPOINT_W,
        Access::ReadWrite => b::HW_BREAKPOINT_RW,
        Access::Exec => b::HW_BREAKPOINT_X,
    };
    a.__bindgen_anon_3.bp_addr = addr;
    a.__bindgen_anon_4.bp_len = crate::arch::current::perf_bp_len(len, access);
    a
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

fn drain_ring(ring: &Ring, scratch: &mut Vec<u8>, sink: &mut dyn FnMut(Record)) -> usize {
    let meta = ring.base as *mut b::perf_event_mmap_page;
    // SAFETY: the metadata page is mapped; data_head is written by the kernel,
    // read with acquire ordering as perf_event_open(2) requires.
    let head = unsafe {
        let h = std::ptr::read_volatile(&(*meta).data_head);
        std::sync::atomic::fence(Ordering::Acquire);
        h
    };
    // SAFETY: data_tail is ours to read and write.
    let mut tail = unsafe { std::ptr::read_volatile(&(*meta).data_tail) };
    // SAFETY: the data area follows the metadata page inside the mapping.
    let data = unsafe { ring.base.add(ring.data_off) };
    let size = ring.data_size as u64;
    let mut n = 0;
    while tail + 8 <= head {
        let mut hdr = [0u8; 8];
        // SAFETY: `data` is this ring's mapped data area of `size` bytes.
        unsafe { copy_wrapped(data, size, tail, &mut hdr) };
        let ty = u32::from_ne_bytes(hdr[0..4].try_into().unwrap());
        let misc = u16::from_ne_bytes(hdr[4..6].try_into().unwrap());
        let rsize = u64::from(u16::from_ne_bytes(hdr[6..8].try_into().unwrap()));
        if rsize < 8 || tail + rsize > head {
            break;
        }
        scratch.clear();
        scratch.resize(rsize as usize, 0);
        // SAFETY: as above; a record is never larger than the ring.
        unsafe { copy_wrapped(data, size, tail, scratch) };
        if let Some(r) = parse_record(ty, misc, &scratch[8..]) {
            sink(r);
        }
        n += 1;
        tail += rsize;
    }
    // SAFETY: publish the new tail after we are done reading (release).
    unsafe {
        std::sync::atomic::fence(Ordering::Release);
        std::ptr::write_volatile(&mut (*meta).data_tail, tail);
    }
    n
}

/// Copies `out.len()` bytes from ring position `pos` of the `size`-byte data
/// area at `data`, wrapping at its end.
///
/// # Safety
/// `data` must point to a mapped ring data area of `size` bytes, and
/// `out.len()` must not exceed `size`. (A raw pointer, not a slice: the
/// kernel writes the area beyond the head concurrently.)
unsafe fn copy_wrapped(data: *const u8, size: u64, pos: u64, out: &mut [u8]) {
    let start = (pos % size) as usize;
    let first = out.len().min(size as usize - start);
    // SAFETY: both ranges lie inside the mapped data area (the caller's
    // contract).
    unsafe {
        std::ptr::copy_nonoverlapping(data.add(start), out.as_mut_ptr(), first);
        if first < out.len() {
            std::ptr::copy_nonoverlapping(data, out.as_mut_ptr().add(first), out.len() - first);
        }
    }
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.0.split_at_checked(8)?;
        self.0 = t;
        Some(u64::from_ne_bytes(h.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        let (h, t) = self.0.split_at_checked(4)?;
        self.0 = t;
        Some(u32::from_ne_bytes(h.try_into().ok()?))
    }
}

/// Call-chain entries from this value up are context markers
/// (`PERF_CONTEXT_USER`…), not addresses (`(u64)-4095`, uapi
/// `perf_event.h`).
const PERF_CONTEXT_MAX: u64 = (-4095i64) as u64;

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

/// Decodes a record body (after the 8-byte header) for our `SAMPLE_TYPE`.
pub fn parse_record(ty: u32, misc: u16, body: &[u8]) -> Option<Record> {
    let mut c = Cursor(body);
    match ty {
        b::PERF_RECORD_SAMPLE => {
            // Order fixed by the ABI: IDENTIFIER, IP, TID, TIME, ADDR, CPU.
            let id = c.u64()?;
            let ip = c.u64()?;
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let time = c.u64()?;
            let addr = c.u64()?;
            let cpu = c.u32()?;
            let _res = c.u32();
            // PERF_SAMPLE_CALLCHAIN, when the event asked for it: the only
            // field after CPU, so present exactly when bytes remain.
            let mut callchain = Vec::new();
            if let Some(nr) = c.u64() {
                let mut first_user = true;
                for _ in 0..nr.min(512) {
                    let Some(v) = c.u64() else { break };
                    if v >= PERF_CONTEXT_MAX {
                        continue; // PERF_CONTEXT_USER and the like
                    }
                    if std::mem::take(&mut first_user) && v == ip {
                        continue;
                    }
                    if v == 0 {
                        break; // a frame pointer that was not one
                    }
                    callchain.push(v);
                }
            }
            Some(Record::Sample {
                id,
                ip,
                pid,
                tid,
                time,
                addr,
                cpu,
                callchain,
            })
        }
        b::PERF_RECORD_FORK | b::PERF_RECORD_EXIT => {
            let pid = c.u32()? as i32;
            let ppid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            let ptid = c.u32()? as i32;
            let time = c.u64()?;
            if ty == b::PERF_RECORD_FORK {
                Some(Record::Fork {
                    pid,
                    ppid,
                    tid,
                    ptid,
                    time,
                })
            } else {
                Some(Record::Exit { pid, tid, time })
            }
        }
        b::PERF_RECORD_COMM => {
            let pid = c.u32()? as i32;
            let tid = c.u32()? as i32;
            // The name, NUL-terminated (padded to 8 bytes), then the
            // trailer; at most 16 bytes of name.
            let rest = body.get(8..)?;
            let end = rest.iter().take(16).position(|&b| b == 0)?;
            let name = String::from_utf8_lossy(&rest[..end]).into_owned();
            if u32::from(misc) & b::PERF_RECORD_MISC_COMM_EXEC == 0 {
                return Some(Record::Comm { pid, tid, name });
            }
            // The trailer ends with TID, TIME, CPU and IDENTIFIER (8 bytes
            // each): the time is the third u64 from the end.
            let at = body.len().checked_sub(24)?;
            let time = u64::from_ne_bytes(body.get(at..at + 8)?.try_into().ok()?);
            Some(Record::Exec {
                pid,
                tid,
                time,
                name,
            })
        }
        b::PERF_RECORD_LOST => {
            let _id = c.u64()?;
            let count = c.u64()?;
            Some(Record::Lost { count })
        }
        _ => None,
    }
}

pub use crate::clock::{monotonic_ns, realtime_ns};

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn parses_sample_in_abi_order() {
        let pidtid = (7u64 << 32) | 5; // pid 5, tid 7 (little-endian u32 pair)
        let body = bytes(&[42, 0x401000, pidtid, 1234, 0x5000, 1]);
        assert_eq!(
            parse_record(b::PERF_RECORD_SAMPLE, 0, &body),
            Some(Record::Sample {
                id: 42,
                ip: 0x401000,
                pid: 5,
                tid: 7,
                time: 1234,
                addr: 0x5000,
                cpu: 1,
                callchain: vec![],
            })
        );
    }

    #[test]
    fn parses_a_sample_with_its_user_call_chain() {
        let pidtid = (7u64 << 32) | 5;
        let user = (-512i64) as u64; // PERF_CONTEXT_USER
        let body = bytes(&[
            42, 0x401000, pidtid, 1234, 0x5000, 1, 4, user, 0x401000, 0x402222, 0x403333,
        ]);
        let Some(Record::Sample { callchain, .. }) = parse_record(b::PERF_RECORD_SAMPLE, 0, &body)
        else {
            panic!("not a sample");
        };
        assert_eq!(
            callchain,
            vec![0x402222, 0x403333],
            "the marker and the ip left out"
        );
    }

    #[test]
    fn parses_fork_and_exit() {
        let body = bytes(&[(5u64 << 32) | 5, (5u64 << 32) | 9, 777]);
        assert_eq!(
            parse_record(b::PERF_RECORD_FORK, 0, &body),
            Some(Record::Fork {
                pid: 5,
                ppid: 5,
                tid: 9,
                ptid: 5,
                time: 777
            })
        );
        assert!(matches!(
            parse_record(b::PERF_RECORD_EXIT, 0, &body),
            Some(Record::Exit { tid: 9, .. })
        ));
        assert_eq!(parse_record(b::PERF_RECORD_SAMPLE, 0, &body[..8]), None);
    }

    #[test]
    fn comm_is_an_exec_with_the_exec_flag_else_a_rename() {
        // pid/tid, the name, then the trailer: pid/tid, time, cpu, id.
        let body = bytes(&[
            (5u64 << 32) | 5,
            u64::from_ne_bytes(*b"sh\0\0\0\0\0\0"),
            (5u64 << 32) | 5,
            4_242,
            1,
            77,
        ]);
        let exec = b::PERF_RECORD_MISC_COMM_EXEC as u16;
        assert_eq!(
            parse_record(b::PERF_RECORD_COMM, exec, &body),
            Some(Record::Exec {
                pid: 5,
                tid: 5,
                time: 4_242,
                name: "sh".into()
            })
        );
        assert_eq!(
            parse_record(b::PERF_RECORD_COMM, 0, &body),
            Some(Record::Comm {
                pid: 5,
                tid: 5,
                name: "sh".into()
            })
        );
    }
}
