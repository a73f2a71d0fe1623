//! Code events: a thread held at a function's entry or return while the
//! daemon arms a watchpoint on what the function was given or returned.
//!
//! A probe is a uprobe with a BPF program (`BPF_PROG_TYPE_KPROBE`,
//! hand-assembled like the signal stops' one), attached where the kernel
//! allows it by a BPF link (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6: the
//! file's path, the instruction's file offset, the process's pid as its
//! filter), else as a uprobe perf event (the uprobe PMU's `type`, `config1`
//! the file's path, `config2` the offset, the `retprobe` bit of `config`
//! for a return) opened on the process's leader. Closing a uprobe waits
//! for an RCU grace period of about 45-110 ms; a perf event's close also
//! holds the kernel's trace-event mutex, so perf closes run one at a time
//! system-wide, while links closed at once share one wait: 100 probes
//! close in about 85 ms on 2 CPUs, against 10 s (kernel-facts §21). The
//! program writes the registers a code event reads (the return
//! value, the six argument registers, `rsp`, `rip`) with the probe's key
//! and the thread's ids into one ring for the daemon, then sends the
//! thread the process's signal-stop signal: the tracer finds the thread at
//! its signal-delivery stop, before it runs another instruction of the
//! program, takes the thread's record from the ring and asks the daemon
//! what to do (kernel-facts §17). No debug-register slot is spent on a
//! probe: uprobes are breakpoint instructions the kernel writes into the
//! process's copy of the page.
//!
//! A disarming probe (`disarm_on`, e.g. `free`) is filtered in the kernel:
//! its program first looks the first argument up in a BPF hash map of the
//! live objects' bases (`set_member`, each base with its object's
//! watchpoint id), and returns at once for any other call. A call that
//! frees a watched object stops no one (`CodeProbe::without_stop`): the
//! program takes the base out of the map and records the call with the
//! object's watchpoint id, flagged [`FREED`], and the thread runs on. The
//! daemon reads those records at the next stop of any thread of a process
//! with probes (before it looks at that stop's hits, so that a store into
//! the freed object is not reported), or, a record no stop read for a
//! [`FREED_SWEEP`], at the next sweep; it closes the object's breakpoints
//! then (kernel-facts §17).
//!
//! Record layout (u64s, native order): key (with [`FREED`] for a freeing
//! call), `tgid << 32 | tid`, rax (a freeing call: the object's
//! watchpoint id), rdi, rsi, rdx, rcx, r8, r9, rsp, rip.

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, LazyLock, Mutex, OnceLock};

use dashmap::DashMap;
use nix::errno::Errno;

use super::signal_bp::SignalMode;
use crate::arch::current::uprobe_ctx;
use crate::backend::fds::{CountedFd, FdBudget, FdCount};
use crate::bpf::{self, Program, RingBuf, asm, helper};
use crate::model::{Pid, Tid};

/// Ring size: 1 MiB (12,000 records; a thread's record is read at its
/// own stop, so at most one per held thread is ever waiting).
const RING_BYTES: usize = 1 << 20;
/// Bytes of a record.
const REC: usize = 11 * 8;
/// The key's flag on the record of a freeing call that stopped no one.
pub const FREED: u64 = 1 << 63;
/// How often the records of freeing calls are read when no stop reads
/// them first.
pub const FREED_SWEEP: std::time::Duration = std::time::Duration::from_millis(10);

/// One probe asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeProbe {
    /// The key its records carry.
    pub key: u64,
    /// The file, as the daemon opens it (through `/proc/PID/root`).
    pub path: std::path::PathBuf,
    /// The probed instruction's file offset.
    pub offset: u64,
    /// At the function's return (else at its first instruction).
    pub ret: bool,
    /// Stop only when the first argument is in the probe's set
    /// ([`set_member`]): the kernel tests it, so other calls (every other
    /// `free`) do not stop the thread.
    pub first_arg_filter: bool,
    /// With `first_arg_filter`: a call whose first argument is in the set
    /// stops no one; the program takes it out of the set and writes a
    /// [`FREED`] record (a disarming probe).
    pub without_stop: bool,
    /// Stop only when the 4 bytes at this address of the process, read by
    /// the probe's program (`bpf_probe_read_user`), equal this value; a
    /// read that fails does not hold the stop back (the dynamic linker's
    /// hook: only its `RT_CONSISTENT` calls stop).
    pub gate: Option<(u64, u32)>,
    /// With `first_arg_filter`: most members its set holds (at most
    /// [`SET_MAX`]).
    pub set_max: u32,
    /// The caller (uid) it is opened for: only root's may take the fds kept
    /// for root.
    pub owner: u32,
    /// The probed instruction is a branch (an entry probe's): a thread held
    /// at its stop is put back before it (`rewind.rs`).
    pub branch: Option<crate::arch::current::insn::Branch>,
}

/// What the program recorded at a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeRecord {
    /// The probe's key.
    pub key: u64,
    /// Process (thread group) id.
    pub pid: Pid,
    /// Thread id.
    pub tid: Tid,
    /// The return value register (meaningful at a return).
    pub ret: u64,
    /// The argument registers, in ABI order (meaningful at an entry).
    pub args: [u64; 6],
    /// Stack pointer.
    pub sp: u64,
    /// Instruction pointer.
    pub ip: u64,
    /// A freeing call that stopped no one ([`FREED`]): `ret` is the freed
    /// object's watchpoint id, `args[0]` its base.
    pub freed: bool,
}

impl CodeRecord {
    fn parse(b: &[u8]) -> Option<CodeRecord> {
        if b.len() < REC {
            return None;
        }
        let w = |i: usize| u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
        let mut args = [0u64; 6];
        for (i, a) in args.iter_mut().enumerate() {
            *a = w(3 + i);
        }
        Some(CodeRecord {
            key: w(0) & !FREED,
            freed: w(0) & FREED != 0,
            pid: (w(1) >> 32) as Pid,
            tid: w(1) as u32 as Tid,
            ret: w(2),
            args,
            sp: w(9),
            ip: w(10),
        })
    }
}

/// The ring and the records read from it but not yet claimed by their
/// thread's stop (several threads stop at once; the ring is read whole).
struct Ring {
    ring: RingBuf,
    waiting: Mutex<Waiting>,
}

/// Records read from the ring, not yet taken.
#[derive(Default)]
struct Waiting {
    /// Of threads held at their stop, by thread.
    held: HashMap<Tid, VecDeque<CodeRecord>>,
    /// Of freeing calls ([`FREED`]), in the ring's order, each with the
    /// number of sweeps before it was read.
    freed: Vec<(CodeRecord, u64)>,
    /// Sweeps so far ([`take_freed`] with `aged_only`).
    sweeps: u64,
}

impl Waiting {
    fn read(&mut self, ring: &RingBuf) {
        ring.consume(&mut |b| {
            if let Some(rec) = CodeRecord::parse(b) {
                if rec.freed {
                    self.freed.push((rec, self.sweeps));
                } else {
                    self.held.entry(rec.tid).or_default().push_back(rec);
                }
            }
        });
    }
}

static RING: OnceLock<Result<Ring, Errno>> = OnceLock::new();

/// How probes are attached here: decided by the first probe that opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attach {
    /// A BPF link of one uprobe (`BPF_TRACE_UPROBE_MULTI`).
    Link,
    /// A uprobe perf event with the program set on it (kernels before
    /// 6.6).
    PerfEvent,
}

static ATTACH: OnceLock<Attach> = OnceLock::new();

/// An open probe.
struct OpenProbe {
    /// The key its records carry.
    key: u64,
    /// Its instruction is a branch (an entry probe).
    branch: Option<crate::arch::current::insn::Branch>,
    /// The uprobe: a BPF link or a perf event. Closed first.
    _uprobe: CountedFd,
    /// Its program.
    _prog: CountedFd,
}

/// Open probes per process.
static PROBES: LazyLock<DashMap<Pid, Vec<OpenProbe>>> = LazyLock::new(DashMap::new);

/// A filtered probe's set of first arguments.
struct Set {
    map: bpf::U64Map,
    /// The map's fd, in the daemon's budget.
    _counted: FdCount,
}

/// The first-argument sets of filtered probes, by key: each member with
/// its value (a disarming probe's: the object's watchpoint id, then the
/// addresses of its breakpoints, 0 past the last).
static SETS: LazyLock<DashMap<u64, Set>> = LazyLock::new(DashMap::new);

/// Words of a set member's value: a watchpoint id and the addresses of
/// its breakpoints (a range takes at most one per debug register).
pub const SET_WORDS: usize = 1 + crate::arch::current::SLOTS;

/// Most values a probe's set may hold (the engine's bound on live objects
/// is at most this).
pub const SET_MAX: u32 = 1 << 16;

/// Kernel memory of a probe's program: its instructions take one page
/// (the fdinfo's `memlock`, for programs up to about 500 instructions).
const PROG_BYTES: u64 = 4096;
/// Kernel memory of a uprobe and its link or perf event, rounded up.
const UPROBE_BYTES: u64 = 2048;

/// Most kernel memory `probe` takes: its program, its uprobe and, with a
/// set, the set full (kernel-facts §21).
pub fn kernel_bytes(probe: &CodeProbe) -> u64 {
    PROG_BYTES
        + UPROBE_BYTES
        + if probe.first_arg_filter {
            bpf::U64Map::kernel_bytes(probe.set_max.clamp(1, SET_MAX), SET_WORDS)
        } else {
            0
        }
}

/// Fds `probe` takes: its uprobe, its program and, with a set, the set.
pub fn fds_of(probe: &CodeProbe) -> usize {
    2 + usize::from(probe.first_arg_filter)
}

/// Adds `v` with `value` (at most [`SET_WORDS`]) to (or removes it from)
/// the set of the probe of key `key` (no such probe: nothing to do).
/// False: the set did not take it (full, or the kernel out of memory).
pub fn set_member(key: u64, v: u64, value: &[u64], member: bool) -> bool {
    match SETS.get(&key) {
        Some(s) if member => s.map.insert(v, value).is_ok(),
        Some(s) => {
            s.map.remove(v);
            true
        }
        None => true,
    }
}

fn ring() -> Result<&'static Ring, Errno> {
    RING.get_or_init(|| {
        RingBuf::new(RING_BYTES).map(|ring| Ring {
            ring,
            waiting: Mutex::new(Waiting::default()),
        })
    })
    .as_ref()
    .map_err(|e| *e)
}

/// The uprobe PMU's type and the `config` bit of a return probe, from
/// sysfs.
pub fn uprobe_pmu() -> Result<(u32, u32), String> {
    let dir = "/sys/bus/event_source/devices/uprobe";
    let ty = std::fs::read_to_string(format!("{dir}/type"))
        .map_err(|e| format!("{dir}/type: {e} (a kernel without CONFIG_UPROBE_EVENTS)"))?;
    let ty: u32 = ty
        .trim()
        .parse()
        .map_err(|_| format!("{dir}/type: {ty:?}"))?;
    let f = std::fs::read_to_string(format!("{dir}/format/retprobe"))
        .map_err(|e| format!("{dir}/format/retprobe: {e}"))?;
    let bit = f
        .trim()
        .strip_prefix("config:")
        .and_then(|b| b.parse::<u32>().ok())
        .ok_or_else(|| format!("{dir}/format/retprobe: {f:?}"))?;
    Ok((ty, bit))
}

/// Whether probes can be opened here (the PMU, the ring).
pub fn available() -> Result<(), String> {
    uprobe_pmu()?;
    ring().map_err(|e| format!("BPF ring buffer: {}", e.desc()))?;
    Ok(())
}

/// The program: record the registers under `key`, then send `sig`; with
/// `set_fd`, only when the first argument is in that set. With `dead_fd`
/// (and `set_fd`), a call whose first argument is in the set sends no
/// signal: the member's addresses go into the `dead` map (muting its
/// breakpoints, see `signal_bp::Mute`), the member is taken out of the
/// set and the record, keyed `key | FREED`, carries the member's
/// watchpoint id in place of the return value register. A record the ring
/// has no room for leaves the member in the set, unmuted (its object stays
/// watched until a later call or the watch's removal).
fn program(
    key: u64,
    sig: i32,
    ring_fd: i32,
    set_fd: Option<i32>,
    dead_fd: Option<i32>,
    gate: Option<(u64, u32)>,
) -> Result<Vec<bpf::Insn>, Errno> {
    let freed = dead_fd.is_some() && set_fd.is_some();
    let mut p = Program::new();
    let send = p.label();
    let out = p.label();
    p.push([asm::mov(6, 1)]);
    if let Some((addr, want)) = gate {
        // The gate's word, read into the stack: not `want`, no stop.
        let open = p.label();
        p.push([asm::mov(1, 10), asm::add_imm(1, -40), asm::mov_imm(2, 4)]);
        p.push(asm::ld_u64(3, addr));
        p.push([asm::call(helper::PROBE_READ_USER)]);
        p.jne_imm(0, 0, open);
        p.push([asm::ldx_w(1, 10, -40)]);
        p.jne_imm(1, want as i32, out);
        p.place(open);
    }
    if let Some(fd) = set_fd {
        p.push([
            asm::ldx_dw(1, 6, uprobe_ctx::ARGS[0]),
            asm::stx_dw(10, -16, 1),
        ]);
        p.push(asm::ld_map(1, fd));
        p.push([
            asm::mov(2, 10),
            asm::add_imm(2, -16),
            asm::call(helper::MAP_LOOKUP_ELEM),
        ]);
        p.jeq_imm(0, 0, out);
        if freed {
            // The member's value: r9 its address, r8 its first word (the
            // object's watchpoint id), kept past the calls below.
            p.push([asm::mov(9, 0), asm::ldx_dw(8, 9, 0)]);
        }
    }
    p.push(asm::ld_map(1, ring_fd));
    p.push([
        asm::mov_imm(2, REC as i32),
        asm::mov_imm(3, 0),
        asm::call(helper::RINGBUF_RESERVE),
    ]);
    p.jeq_imm(0, 0, if freed { out } else { send });
    p.push([asm::mov(7, 0)]);
    if let (Some(dead), Some(fd)) = (dead_fd.filter(|_| freed), set_fd) {
        // Mute each of its addresses, then take the member out.
        let muted = p.label();
        for i in 1..SET_WORDS {
            p.push([asm::ldx_dw(1, 9, (8 * i) as i16)]);
            p.jeq_imm(1, 0, muted);
            p.push([
                asm::stx_dw(10, -24, 1),
                asm::mov_imm(1, 1),
                asm::stx_dw(10, -32, 1),
            ]);
            p.push(asm::ld_map(1, dead));
            p.push([
                asm::mov(2, 10),
                asm::add_imm(2, -24),
                asm::mov(3, 10),
                asm::add_imm(3, -32),
                asm::mov_imm(4, 0),
                asm::call(helper::MAP_UPDATE_ELEM),
            ]);
        }
        p.place(muted);
        p.push(asm::ld_map(1, fd));
        p.push([
            asm::mov(2, 10),
            asm::add_imm(2, -16),
            asm::call(helper::MAP_DELETE_ELEM),
        ]);
    }
    p.push(asm::ld_u64(1, if freed { key | FREED } else { key }));
    p.push([asm::stx_dw(7, 0, 1)]);
    p.push(bpf::current_pid_tgid(crate::pidns::own(), -8));
    p.push([asm::stx_dw(7, 8, 0)]);
    let regs = std::iter::once(uprobe_ctx::RET)
        .chain(uprobe_ctx::ARGS)
        .chain([uprobe_ctx::SP, uprobe_ctx::IP]);
    for (i, off) in regs.enumerate() {
        if freed && i == 0 {
            p.push([asm::stx_dw(7, 16, 8)]);
            continue;
        }
        p.push([
            asm::ldx_dw(1, 6, off),
            asm::stx_dw(7, (16 + 8 * i) as i16, 1),
        ]);
    }
    p.push([
        asm::mov(1, 7),
        asm::mov_imm(2, 0),
        asm::call(helper::RINGBUF_SUBMIT),
    ]);
    // A freeing call's record sent, nothing more: `send` is then where
    // the program ends (no signal is sent on any path).
    p.place(send);
    if !freed {
        p.push([asm::mov_imm(1, sig), asm::call(helper::SEND_SIGNAL_THREAD)]);
    }
    p.place(out);
    p.push([asm::mov_imm(0, 0), asm::exit()]);
    p.build().map_err(|e| {
        tracing::warn!("code event program: {e}");
        Errno::EINVAL
    })
}

fn load(insns: &[bpf::Insn], attach: Attach) -> Result<OwnedFd, Errno> {
    let as_type = match attach {
        Attach::Link => bpf::TRACE_UPROBE_MULTI,
        Attach::PerfEvent => 0,
    };
    bpf::load_program_for(bpf::PROG_TYPE_KPROBE, as_type, insns).map_err(|e| {
        tracing::warn!(log = %e, "code event program refused");
        e.errno
    })
}

/// Why a probe was not opened.
#[derive(Debug)]
pub enum OpenError {
    /// Its fds would not fit the daemon's budget (or the kernel said
    /// EMFILE).
    Fds(crate::error::WpdError),
    /// The kernel refused it.
    Kernel(Errno),
}

/// Opens `probe` on process `pid` (its leader's tid), whose threads stop
/// with `mode`'s signal; its fds are counted in `mode`'s budget.
pub fn open(pid: Pid, probe: &CodeProbe, mode: &SignalMode) -> Result<(), OpenError> {
    let fds = &mode.fds;
    let needed = fds_of(probe);
    let what = || {
        format!(
            "a uprobe and its BPF program{}",
            if probe.first_arg_filter {
                " and the set of live objects it filters on"
            } else {
                ""
            }
        )
    };
    fds.check_for(probe.owner, "this code event", needed, what())
        .map_err(OpenError::Fds)?;
    let kernel = |e: Errno| {
        if crate::backend::fds::is_out_of_fds(e) {
            OpenError::Fds(fds.refusal("this code event", needed, what(), true))
        } else {
            OpenError::Kernel(e)
        }
    };
    let r = ring().map_err(kernel)?;
    let dead_fd = if probe.without_stop && probe.first_arg_filter {
        Some(mode.mute().map_err(kernel)?.dead.raw_fd())
    } else {
        None
    };
    let set = if probe.first_arg_filter {
        let map = bpf::U64Map::new(probe.set_max.clamp(1, SET_MAX), SET_WORDS).map_err(kernel)?;
        Some(Set {
            map,
            _counted: fds.count(1),
        })
    } else {
        None
    };
    let insns = program(
        probe.key,
        mode.signal as i32,
        r.ring.raw_fd(),
        set.as_ref().map(|s| s.map.raw_fd()),
        dead_fd,
        probe.gate,
    )
    .map_err(kernel)?;
    let path = CString::new(probe.path.as_os_str().as_bytes())
        .map_err(|_| OpenError::Kernel(Errno::EINVAL))?;
    let (uprobe, prog) = attach(pid, probe, &path, &insns, fds).map_err(kernel)?;
    if let Some(set) = set {
        SETS.insert(probe.key, set);
    }
    PROBES.entry(pid).or_default().push(OpenProbe {
        key: probe.key,
        branch: probe.branch.filter(|_| !probe.ret),
        _uprobe: uprobe,
        _prog: prog,
    });
    Ok(())
}

/// The uprobe of `probe` with the program `insns`, attached as this
/// kernel allows (a link, else a perf event: tried in that order until
/// one attaches, then always that one).
fn attach(
    pid: Pid,
    probe: &CodeProbe,
    path: &CString,
    insns: &[bpf::Insn],
    fds: &Arc<FdBudget>,
) -> Result<(CountedFd, CountedFd), Errno> {
    use crate::backend::perf::{attr, sys};
    let known = ATTACH.get().copied();
    if known != Some(Attach::PerfEvent) {
        let prog = fds.adopt(load(insns, Attach::Link)?);
        match bpf::uprobe_link(&prog, path, probe.offset, probe.ret, pid) {
            Ok(link) => {
                let _ = ATTACH.set(Attach::Link);
                return Ok((fds.adopt(link), prog));
            }
            // Known to work here: the refusal is this probe's.
            Err(e) if known == Some(Attach::Link) => return Err(e),
            // A kernel without uprobe links says EINVAL (an unknown attach
            // type), as it does for a bad offset: the perf event tells.
            Err(Errno::EINVAL | Errno::EOPNOTSUPP | Errno::ENOSYS) => {}
            Err(e) => return Err(e),
        }
    }
    let prog = fds.adopt(load(insns, Attach::PerfEvent)?);
    let (pmu, bit) = uprobe_pmu().map_err(|_| Errno::ENOENT)?;
    let mut a = attr::uprobe(pmu, path, probe.offset, probe.ret.then_some(bit));
    let fd = sys::open(&mut a, pid, -1, "perf_event_open(uprobe)").map_err(|e| e.errno)?;
    let fd = fds.adopt(fd);
    sys::set_bpf(&fd, &prog).map_err(|e| e.errno)?;
    if known.is_none() && ATTACH.set(Attach::PerfEvent).is_ok() {
        tracing::info!(
            "code events: uprobe perf events (this kernel has no uprobe BPF links, Linux 6.6): \
             each takes about 100 ms to close, one at a time"
        );
    }
    Ok((fd, prog))
}

/// How probes are attached here, once one was: "bpf-link", "perf-event".
pub fn attach_kind() -> Option<&'static str> {
    ATTACH.get().map(|a| match a {
        Attach::Link => "bpf-link",
        Attach::PerfEvent => "perf-event",
    })
}

/// Closes `pid`'s probes with keys `keys` (every one with `None`), at once:
/// each close waits for an RCU grace period, and closes made together
/// share it (see the module's header). It returns once they are closed,
/// or after [`CLOSE_WAIT`] with the rest closing in the background (a
/// grace period can take tens of seconds when the process's threads keep
/// every CPU busy, kernel-facts §22): a probe still open meanwhile stops
/// no one the daemon holds (its records name a key no longer known, and
/// the tracer restarts the thread).
pub fn close(pid: Pid, keys: Option<&[u64]>) {
    // Taken out of the maps first: nothing is closed under their locks.
    let taken: Vec<OpenProbe> = match keys {
        None => PROBES.remove(&pid).map(|(_, v)| v).unwrap_or_default(),
        Some(keys) => match PROBES.get_mut(&pid) {
            Some(mut v) => {
                let (out, keep) = std::mem::take(&mut *v)
                    .into_iter()
                    .partition(|p| keys.contains(&p.key));
                *v = keep;
                out
            }
            None => Vec::new(),
        },
    };
    let keys: Vec<u64> = match keys {
        Some(k) => k.to_vec(),
        None => taken.iter().map(|p| p.key).collect(),
    };
    let sets: Vec<Set> = keys
        .iter()
        .filter_map(|k| SETS.remove(k).map(|(_, s)| s))
        .collect();
    let closed = close_all(taken, pid);
    drop(sets);
    if keys.is_empty() || !has_probes(pid) {
        forget_pid(pid);
    }
    if !closed {
        tracing::info!(
            pid,
            "closing code probes takes longer than {CLOSE_WAIT:?} (a grace period of the \
             kernel's): finished in the background"
        );
    }
}

/// Most threads closing probes at once.
const CLOSERS: usize = 64;

/// How long [`close`] waits for its probes' closes.
pub const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// Closes `probes` of `pid`, their uprobes from up to [`CLOSERS`] threads
/// at once; true if they are closed within [`CLOSE_WAIT`]. Records the
/// probes write meanwhile are dropped once they are closed.
fn close_all(probes: Vec<OpenProbe>, pid: Pid) -> bool {
    if probes.is_empty() {
        return true;
    }
    let threads = probes.len().min(CLOSERS);
    let mut groups: Vec<Vec<OpenProbe>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, p) in probes.into_iter().enumerate() {
        groups[i % threads].push(p);
    }
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let mut waiting = 0;
    for g in groups {
        let done = done_tx.clone();
        let spawned = std::thread::Builder::new()
            .name("wpd-close".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                drop(g);
                if !has_probes(pid) {
                    forget_pid(pid);
                }
                let _ = done.send(());
            });
        match spawned {
            Ok(_) => waiting += 1,
            // No thread: the group was dropped with the closure (closed
            // here).
            Err(e) => tracing::warn!("closing code probes on this thread: {e}"),
        }
    }
    let deadline = std::time::Instant::now() + CLOSE_WAIT;
    while waiting > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(()) => waiting -= 1,
            Err(_) => return false,
        }
    }
    true
}

/// Whether `pid` has probes open.
pub fn has_probes(pid: Pid) -> bool {
    PROBES.get(&pid).is_some_and(|v| !v.is_empty())
}

/// The branch probe `key` of `pid` sits on, if it is an entry probe on one.
pub fn branch_of(pid: Pid, key: u64) -> Option<crate::arch::current::insn::Branch> {
    PROBES
        .get(&pid)?
        .iter()
        .find(|p| p.key == key)
        .and_then(|p| p.branch)
}

/// The records of `tid` written so far (its stop's), oldest first.
pub fn take(tid: Tid) -> Vec<CodeRecord> {
    let Ok(r) = ring() else {
        return Vec::new();
    };
    let mut waiting = r.waiting.lock().unwrap();
    waiting.read(&r.ring);
    waiting.held.remove(&tid).map(Vec::from).unwrap_or_default()
}

/// The records of freeing calls written so far ([`FREED`]), oldest first
/// (at a stop). With `aged_only` (a sweep), only those already read by the
/// previous sweep: a record a stop takes within one sweep's period is
/// never the sweeping thread's, which would contend with that stop's
/// tracer for the process.
pub fn take_freed(aged_only: bool) -> Vec<CodeRecord> {
    let Some(Ok(r)) = RING.get() else {
        return Vec::new();
    };
    let mut guard = r.waiting.lock().unwrap();
    let waiting = &mut *guard;
    waiting.read(&r.ring);
    let taken = if aged_only {
        let now = waiting.sweeps;
        waiting.sweeps += 1;
        let (old, young) = std::mem::take(&mut waiting.freed)
            .into_iter()
            .partition(|&(_, seen)| seen < now);
        waiting.freed = young;
        old
    } else {
        std::mem::take(&mut waiting.freed)
    };
    taken.into_iter().map(|(rec, _)| rec).collect()
}

/// Records of threads that exited before their stop are dropped.
pub fn forget(tid: Tid) {
    if let Some(Ok(r)) = RING.get() {
        r.waiting.lock().unwrap().held.remove(&tid);
    }
}

/// The records of process `pid`'s threads are dropped (its probes are
/// closed: no stop of it will take them).
fn forget_pid(pid: Pid) {
    if let Some(Ok(r)) = RING.get() {
        let mut w = r.waiting.lock().unwrap();
        w.read(&r.ring);
        w.held.retain(|_, recs| {
            recs.retain(|rec| rec.pid != pid);
            !recs.is_empty()
        });
        w.freed.retain(|(rec, _)| rec.pid != pid);
    }
}
