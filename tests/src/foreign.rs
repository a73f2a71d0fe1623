//! Foreign slot owners: a hardware breakpoint held by the test itself, and the bare perf floors the benchmark compares with.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result};

/// `struct perf_event_attr` as of PERF_ATTR_SIZE_VER7 (128 bytes).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// Bit field: disabled (bit 0), ..., exclude_kernel (bit 5), exclude_hv (bit 6), ...
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    bp_addr: u64,
    bp_len: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved_2: u16,
    aux_sample_size: u32,
    reserved_3: u32,
    sig_data: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 128);

const PERF_TYPE_BREAKPOINT: u32 = 5;
const HW_BREAKPOINT_W: u32 = 2;
const ATTR_EXCLUDE_KERNEL: u64 = 1 << 5;
const ATTR_EXCLUDE_HV: u64 = 1 << 6;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

/// An enabled, counting (never signalling) write breakpoint opened with `perf_event_open` by
/// this process on another thread: it occupies one of that thread's debug-register slots, as
/// a debugger would. Closed on drop.
pub struct ForeignBreakpoint {
    fd: OwnedFd,
    /// Thread it is on.
    pub tid: i32,
}

/// The perf syscalls the daemon makes to arm one thread on one CPU, made
/// directly (the "floor" of the benchmarks): a sampling, inheritable write
/// breakpoint on `(tid, cpu)`, its id, and its output redirected to
/// `collector` (a per-CPU ring owner from [`floor_collector`]).
pub fn floor_perf_arm(tid: i32, addr: u64, cpu: i32, collector: &OwnedFd) -> Result<OwnedFd> {
    const ATTR_INHERIT: u64 = 1 << 1;
    const PERF_EVENT_IOC_ID: libc::c_ulong = 0x8008_2407;
    const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        sample_period: 1,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | ATTR_INHERIT,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: addr,
        bp_len: 8,
        ..Default::default()
    };
    let fd = perf_open(&attr, tid, cpu)?;
    let mut id = 0u64;
    // SAFETY: plain ioctls on descriptors we own; `id` is a valid out pointer.
    unsafe {
        libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_ID, &mut id as *mut u64);
        libc::ioctl(
            fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_OUTPUT,
            collector.as_raw_fd(),
        );
    }
    Ok(fd)
}

/// The breakpoint the daemon's per-thread path opens per thread: on every CPU at once
/// (`cpu = -1`), inherited by threads created later, with a BPF program attached
/// (`PERF_EVENT_IOC_SET_BPF`) instead of a ring.
pub fn floor_perf_arm_bpf(tid: i32, addr: u64, prog: &OwnedFd) -> Result<OwnedFd> {
    const ATTR_INHERIT: u64 = 1 << 1;
    const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        sample_period: 1,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | ATTR_INHERIT,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: addr,
        bp_len: 8,
        ..Default::default()
    };
    let fd = perf_open(&attr, tid, -1)?;
    // SAFETY: an ioctl on a descriptor we own, taking the program's fd by value.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), PERF_EVENT_IOC_SET_BPF, prog.as_raw_fd()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("PERF_EVENT_IOC_SET_BPF");
    }
    Ok(fd)
}

/// A BPF program of type perf_event that does nothing (`r0 = 0; exit`), for
/// [`floor_perf_arm_bpf`].
pub fn floor_bpf_program() -> Result<OwnedFd> {
    // struct bpf_insn: code, dst:4|src:4, off, imm.
    let insns: [u64; 2] = [0xb7, 0x95];
    let license = c"GPL";
    let mut attr = [0u64; 16];
    attr[0] = 7 | (2u64 << 32); // prog_type perf_event, insn_cnt 2
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    // SAFETY: a BPF_PROG_LOAD attr whose pointers outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            5 as libc::c_long,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("bpf(BPF_PROG_LOAD)");
    }
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The thread-tracking event the daemon opens per thread and CPU at attach
/// (a dummy software event reporting FORK/EXIT/COMM, inherited by new
/// threads), output redirected to `collector`.
pub fn floor_perf_track(tid: i32, cpu: i32, collector: &OwnedFd) -> Result<OwnedFd> {
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
    // inherit | comm | task | sample_id_all | comm_exec | inherit_thread
    let bits = (1 << 1) | (1 << 9) | (1 << 13) | (1 << 18) | (1 << 24) | (1u64 << 35);
    let attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_DUMMY,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | bits,
        ..Default::default()
    };
    let fd = perf_open(&attr, tid, cpu)?;
    // SAFETY: plain ioctl on descriptors we own.
    unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            PERF_EVENT_IOC_SET_OUTPUT,
            collector.as_raw_fd(),
        )
    };
    Ok(fd)
}

/// The kernel's own floor for thread churn (`perf bench breakpoint thread`): a counting write
/// breakpoint of 8 bytes at `addr` on thread `tid`, all CPUs (`cpu = -1`), `inherit = 1`, so
/// that the kernel copies it into every thread `tid` creates.
pub fn floor_perf_inherit(tid: i32, addr: u64) -> Result<OwnedFd> {
    const ATTR_INHERIT: u64 = 1 << 1;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV | ATTR_INHERIT,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: addr,
        bp_len: 8,
        ..Default::default()
    };
    perf_open(&attr, tid, -1)
}

/// The free-slot check wpd's ptrace backend makes on a thread before arming
/// it: one disabled 1-byte write breakpoint opened on `tid` and closed
/// (disabled breakpoints hold a slot, so the open fails with ENOSPC on a
/// full thread). Returns whether the thread had a free slot.
pub fn floor_probe_slot(tid: i32) -> Result<bool> {
    const ATTR_DISABLED: u64 = 1;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        flags: ATTR_DISABLED | ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
        bp_type: HW_BREAKPOINT_W,
        bp_addr: 0x1000,
        bp_len: 1,
        ..Default::default()
    };
    match perf_open(&attr, tid, -1) {
        Ok(_fd) => Ok(true),
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .and_then(|e| e.raw_os_error())
                == Some(libc::ENOSPC) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// A per-CPU dummy event that owns output for [`floor_perf_arm`].
pub fn floor_collector(cpu: i32) -> Result<OwnedFd> {
    const PERF_TYPE_SOFTWARE: u32 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    let attr = PerfEventAttr {
        type_: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: PERF_COUNT_SW_DUMMY,
        flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV,
        ..Default::default()
    };
    perf_open(&attr, -1, cpu)
}

fn perf_open(attr: &PerfEventAttr, pid: i32, cpu: i32) -> Result<OwnedFd> {
    // SAFETY: `attr` is a valid perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("perf_event_open(pid {pid}, cpu {cpu})"));
    }
    // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

impl ForeignBreakpoint {
    /// Opens a write breakpoint of `len` bytes at `addr` in thread `tid` (0: this thread).
    pub fn open(tid: i32, addr: u64, len: u64) -> Result<ForeignBreakpoint> {
        let attr = PerfEventAttr {
            type_: PERF_TYPE_BREAKPOINT,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            flags: ATTR_EXCLUDE_KERNEL | ATTR_EXCLUDE_HV, // disabled = 0: armed at once
            bp_type: HW_BREAKPOINT_W,
            bp_addr: addr,
            bp_len: len,
            ..Default::default()
        };
        // SAFETY: `attr` is a valid perf_event_attr of the size it declares; the other
        // arguments are plain integers.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                tid as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                PERF_FLAG_FD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| {
                format!("perf_event_open(breakpoint W len {len} at {addr:#x}, tid {tid})")
            });
        }
        // SAFETY: the kernel just returned this new descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        Ok(ForeignBreakpoint { fd, tid })
    }

    /// The perf file descriptor.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}
