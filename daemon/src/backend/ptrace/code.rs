//! Code events: a thread held at a function's entry or return while the
//! daemon arms a watchpoint on what the function was given or returned.
//!
//! A probe is a uprobe perf event (the uprobe PMU's `type`, `config1` the
//! file's path, `config2` the instruction's file offset, the `retprobe`
//! bit of `config` for a return) opened on the process's leader, with a
//! BPF program (`BPF_PROG_TYPE_KPROBE`, hand-assembled like the signal
//! stops' one) that writes the registers a code event reads (the return
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

/// An open probe: its key, its event, its program.
type OpenProbe = (u64, OwnedFd, Arc<OwnedFd>);

/// Open probes per process.
static PROBES: LazyLock<DashMap<Pid, Vec<OpenProbe>>> = LazyLock::new(DashMap::new);

/// The first-argument sets of filtered probes, by key: each member with
/// its value (a disarming probe's: the object's watchpoint id, then the
/// addresses of its breakpoints, 0 past the last).
static SETS: LazyLock<DashMap<u64, bpf::U64Map>> = LazyLock::new(DashMap::new);

/// Words of a set member's value: a watchpoint id and the addresses of
/// its breakpoints (a range takes at most one per debug register).
pub const SET_WORDS: usize = 1 + crate::arch::current::SLOTS;

/// Most values a probe's set holds.
const SET_MAX: u32 = 1 << 16;

/// Adds `v` with `value` (at most [`SET_WORDS`]) to (or removes it from)
/// the set of the probe of key `key`.
pub fn set_member(key: u64, v: u64, value: &[u64], member: bool) {
    if let Some(s) = SETS.get(&key) {
        if member {
            let _ = s.insert(v, value);
        } else {
            s.remove(v);
        }
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
) -> Result<OwnedFd, Errno> {
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
    let insns = p.build().map_err(|_| Errno::EINVAL)?;
    bpf::load_program(bpf::PROG_TYPE_KPROBE, &insns).map_err(|e| {
        tracing::warn!(log = %e, "code event program refused");
        e.errno
    })
}

/// Opens `probe` on process `pid` (its leader's tid), whose threads stop
/// with `mode`'s signal.
pub fn open(pid: Pid, probe: &CodeProbe, mode: &SignalMode) -> Result<(), Errno> {
    use crate::backend::perf::{attr, sys};
    let r = ring()?;
    let (pmu, bit) = uprobe_pmu().map_err(|_| Errno::ENOENT)?;
    let dead_fd = if probe.without_stop && probe.first_arg_filter {
        Some(mode.mute()?.dead.raw_fd())
    } else {
        None
    };
    let set_fd = if probe.first_arg_filter {
        let s = bpf::U64Map::new(SET_MAX, SET_WORDS)?;
        let fd = s.raw_fd();
        SETS.insert(probe.key, s);
        Some(fd)
    } else {
        None
    };
    let prog = Arc::new(program(
        probe.key,
        mode.signal as i32,
        r.ring.raw_fd(),
        set_fd,
        dead_fd,
        probe.gate,
    )?);
    let path = CString::new(probe.path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let mut a = attr::uprobe(pmu, &path, probe.offset, probe.ret.then_some(bit));
    let fd = sys::open(&mut a, pid, -1, "perf_event_open(uprobe)").map_err(|e| e.errno)?;
    sys::set_bpf(&fd, &prog).map_err(|e| e.errno)?;
    PROBES.entry(pid).or_default().push((probe.key, fd, prog));
    Ok(())
}

/// Closes `pid`'s probes with key `key` (every one with `None`).
pub fn close(pid: Pid, key: Option<u64>) {
    match key {
        None => {
            if let Some((_, v)) = PROBES.remove(&pid) {
                for (k, _, _) in v {
                    SETS.remove(&k);
                }
            }
        }
        Some(k) => {
            if let Some(mut v) = PROBES.get_mut(&pid) {
                v.retain(|(key, _, _)| *key != k);
            }
            SETS.remove(&k);
        }
    }
}

/// Whether `pid` has probes open.
pub fn has_probes(pid: Pid) -> bool {
    PROBES.get(&pid).is_some_and(|v| !v.is_empty())
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
