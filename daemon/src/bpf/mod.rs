//! The few `bpf()` operations wpd needs, without a BPF toolchain: programs
//! are a handful of instructions assembled here (no compiler, no object
//! files, nothing a fresh machine lacks), maps are a ring buffer and a
//! counter array. Jumps name a [`Label`], resolved when a [`Program`] is
//! built (no offset is counted by hand).
//!
//! Users: the ptrace backend's signal stops (a program sending a signal at
//! a hit) and the perf backend's per-thread path (a program writing each
//! hit into one ring buffer shared by every breakpoint of the daemon).
//! Everything here needs CAP_BPF and CAP_PERFMON (or root).
//!
//! Rooms: `asm.rs` (the instructions), `program.rs` (a program and its
//! labels), `load.rs` (loading a program), `link.rs` (attaching one),
//! `maps.rs` (hash and array maps), `ringbuf.rs` (the ring buffer the
//! daemon consumes). This file holds the instruction, the helpers' ids and
//! the `bpf()` call itself.

pub mod asm;
mod link;
mod load;
mod maps;
mod program;
mod ringbuf;

pub use link::{TRACE_UPROBE_MULTI, raw_tracepoint_open, uprobe_link, uprobe_multi_link};
pub use load::{LoadError, load_program, load_program_for};
#[cfg(test)]
pub use load::{PROG_TYPE_SOCKET_FILTER, test_run};
pub use maps::{Counters, HASH_ENTRY_BYTES, U64Map};
pub use program::{AsmError, Cmp, Label, Program, current_pid_tgid};
pub use ringbuf::RingBuf;

use nix::errno::Errno;

/// One BPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// Registers r0-r10.
pub type Reg = u8;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_LINK_CREATE: libc::c_long = 28;

/// `BPF_PROG_TYPE_KPROBE`: runs at a kprobe or uprobe (attached to its perf
/// event), the probed task's `struct pt_regs` as context.
pub const PROG_TYPE_KPROBE: u32 = 2;
/// `BPF_PROG_TYPE_PERF_EVENT`: runs at a perf event's overflow (a hit).
pub const PROG_TYPE_PERF_EVENT: u32 = 7;
/// `BPF_PROG_TYPE_RAW_TRACEPOINT`: runs at a tracepoint, its arguments (as
/// the kernel passes them to the tracepoint, each a u64) as context. Needs
/// no tracefs: attached by name ([`raw_tracepoint_open`]).
pub const PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// Helper ids (`enum bpf_func_id`).
pub mod helper {
    pub const MAP_LOOKUP_ELEM: i32 = 1;
    pub const MAP_UPDATE_ELEM: i32 = 2;
    pub const MAP_DELETE_ELEM: i32 = 3;
    pub const KTIME_GET_NS: i32 = 5;
    pub const GET_SMP_PROCESSOR_ID: i32 = 8;
    pub const GET_CURRENT_PID_TGID: i32 = 14;
    pub const GET_STACK: i32 = 67;
    pub const GET_NS_CURRENT_PID_TGID: i32 = 120;
    pub const PROBE_READ_USER: i32 = 112;
    pub const PROBE_READ_KERNEL: i32 = 113;
    pub const SEND_SIGNAL_THREAD: i32 = 117;
    pub const RINGBUF_RESERVE: i32 = 131;
    pub const RINGBUF_SUBMIT: i32 = 132;
    pub const GET_ATTACH_COOKIE: i32 = 174;
}

fn sys_bpf<T>(cmd: libc::c_long, attr: &T) -> Result<libc::c_long, Errno> {
    // SAFETY: attr points to a valid, fully initialised bpf_attr prefix of
    // the size given, whose pointers outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>(),
        )
    };
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

/// `union bpf_attr` as BPF_MAP_CREATE reads it.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    _rest: [u32; 27],
}
