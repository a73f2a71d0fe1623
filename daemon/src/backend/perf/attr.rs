//! What each perf event wpd opens asks of the kernel: one constructor per
//! kind of event, pure functions over `perf_event_attr`, unit-tested field
//! by field (the syscalls are in `sys.rs`).
//!
//! - collector: a dummy software event per CPU owning a ring (and, on the
//!   per-thread path, seeing every task's FORK, EXIT and COMM);
//! - tracker: a dummy event per thread and CPU reporting its thread
//!   lifecycle and that of every thread it creates (per-CPU path);
//! - breakpoint, per-CPU path: writes a sample into its CPU's ring;
//! - breakpoint, per-thread path: runs a BPF program (`ring/`);
//! - the probe's disabled breakpoint (`probe.rs`), and the signal stops'
//!   breakpoint (`ptrace/signal_bp.rs`).

use perf_event_open_sys::bindings as b;

use crate::model::{Access, Piece, WatchLen};

/// Sample fields of every event. They share rings, so the fields every
/// record carries must agree (`sample_id_all` appends the same trailer to
/// FORK, EXIT and COMM records); a breakpoint of a watchpoint asking for a
/// backtrace adds `PERF_SAMPLE_CALLCHAIN`, and a breakpoint on stores
/// `PERF_SAMPLE_REGS_USER` (with a chain: [`sampled_breakpoint`]), which
/// only samples carry, last, so a sample's length tells whether it has
/// them.
pub const SAMPLE_TYPE: u64 = (b::PERF_SAMPLE_IDENTIFIER
    | b::PERF_SAMPLE_IP
    | b::PERF_SAMPLE_TID
    | b::PERF_SAMPLE_TIME
    | b::PERF_SAMPLE_ADDR
    | b::PERF_SAMPLE_CPU) as u64;

/// What `read(2)` of an event sharing the rings returns: its count, then
/// the samples the kernel dropped because the ring was full
/// (`PERF_FORMAT_LOST`, Linux 6.0). A full ring's `PERF_RECORD_LOST` comes
/// only with the next record that fits (kernel-facts §16): the daemon reads
/// these counts to know what was dropped before such a record comes.
/// A kernel without it refuses the event; `sys::open` then opens it
/// without.
pub const READ_FORMAT: u64 = b::PERF_FORMAT_LOST as u64;

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

/// What every event writing into the collectors' rings shares: the sample
/// fields, user space only, CLOCK_MONOTONIC times.
fn base() -> b::perf_event_attr {
    let mut a = b::perf_event_attr {
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        ..Default::default()
    };
    a.sample_type = SAMPLE_TYPE;
    a.read_format = READ_FORMAT;
    a.set_sample_id_all(1);
    a.set_exclude_kernel(1);
    a.set_exclude_hv(1);
    a.set_use_clockid(1);
    a.clockid = libc::CLOCK_MONOTONIC;
    a
}

/// A CPU's collector, waking its reader when `wakeup_bytes` are written.
/// On the per-thread path (`see_tasks`) there are no trackers: the
/// collectors see every task's FORK, EXIT and COMM on their CPU (the drain
/// keeps those of tracked processes).
pub fn collector(see_tasks: bool, wakeup_bytes: u32) -> b::perf_event_attr {
    let mut a = base();
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = u64::from(b::PERF_COUNT_SW_DUMMY);
    a.set_watermark(1);
    a.__bindgen_anon_2.wakeup_watermark = wakeup_bytes;
    if see_tasks {
        a.set_task(1);
        a.set_comm(1);
        a.set_comm_exec(1);
    }
    a
}

/// A thread's tracker on one CPU: its FORK/EXIT/COMM records and, through
/// inheritance, those of every thread it creates.
pub fn tracker() -> b::perf_event_attr {
    let mut a = base();
    a.type_ = b::PERF_TYPE_SOFTWARE;
    a.config = u64::from(b::PERF_COUNT_SW_DUMMY);
    a.set_task(1);
    a.set_comm(1);
    a.set_comm_exec(1);
    a.set_inherit(1);
    a.set_inherit_thread(1);
    a
}

/// A hardware breakpoint on `len` bytes at `addr` (the common part of the
/// breakpoints below).
pub fn breakpoint(addr: u64, len: WatchLen, access: Access) -> b::perf_event_attr {
    let mut a = base();
    a.type_ = b::PERF_TYPE_BREAKPOINT;
    a.bp_type = bp_type(access);
    a.__bindgen_anon_3.bp_addr = addr;
    a.__bindgen_anon_4.bp_len = crate::arch::current::perf_bp_len(len, access);
    a
}

fn bp_type(access: Access) -> u32 {
    match access {
        Access::Write => b::HW_BREAKPOINT_W,
        Access::ReadWrite => b::HW_BREAKPOINT_RW,
        Access::Exec => b::HW_BREAKPOINT_X,
    }
}

/// A breakpoint of the per-CPU path: a sample per hit, removed at exec,
/// with the user call chain (up to `callers` callers, within the kernel's
/// `max_stack`) when asked for. A breakpoint on stores also samples the
/// user registers at the trap (`PERF_SAMPLE_REGS_USER`) when `regs`,
/// which tell what the store wrote (`backend::stored`): the sample's memory
/// is read later, by when another thread may have stored there. Its samples
/// then always carry a call chain (of the trap's ip alone when no caller
/// is asked for), so a sample's fields after `CPU` read one way: a chain
/// when bytes remain, then registers when bytes still remain. The
/// registers make a sample four times as large (224 bytes against 56), so
/// a CPU's ring holds a quarter as many: an aggregate watchpoint, for a
/// variable too hot to stream, goes without (its counts over its samples'
/// values).
pub fn sampled_breakpoint(
    piece: Piece,
    access: Access,
    inherit: Inherit,
    (callers, max_stack): (u16, u16),
    regs: bool,
) -> b::perf_event_attr {
    let mut a = breakpoint(piece.addr, piece.len, access);
    a.__bindgen_anon_1.sample_period = 1;
    let regs = regs && access != Access::Exec;
    if callers > 0 || regs {
        // The kernel walks the user stack's frame pointers at the trap;
        // its chain starts with the sample's ip.
        a.sample_type |= u64::from(b::PERF_SAMPLE_CALLCHAIN);
        a.set_exclude_callchain_kernel(1);
        a.sample_max_stack = (callers + 1).min(max_stack);
    }
    if regs {
        a.sample_type |= u64::from(b::PERF_SAMPLE_REGS_USER);
        a.sample_regs_user = crate::arch::current::perf_regs::SAMPLE_MASK;
    }
    a.set_remove_on_exec(1);
    inherit.set(&mut a);
    a
}

/// A breakpoint of the per-thread path: each hit runs the program attached
/// to it; removed at exec.
pub fn program_breakpoint(piece: Piece, access: Access, inherit: Inherit) -> b::perf_event_attr {
    let mut a = breakpoint(piece.addr, piece.len, access);
    a.__bindgen_anon_1.sample_period = 1;
    a.set_remove_on_exec(1);
    inherit.set(&mut a);
    a
}

/// Makes breakpoint `a` signal the thread that hits it (`sigtrap`:
/// `SIGTRAP`, `si_code` `TRAP_PERF`, `si_addr` the watched address,
/// `si_perf_data` `sig_data`) before its next instruction, when its
/// overflow is not dropped by the program attached to it: a feedback
/// breakpoint, for the library preloaded into the program
/// (`engine/feedback.rs`). The kernel requires `remove_on_exec` with it.
pub fn signal_thread(a: &mut b::perf_event_attr, sig_data: u64) {
    a.set_sigtrap(1);
    a.set_remove_on_exec(1);
    a.sig_data = sig_data;
}

/// The probe's breakpoint: disabled (it only holds a slot, kernel-facts
/// §5), anywhere.
pub fn probe() -> b::perf_event_attr {
    let mut a = breakpoint(
        0x1000,
        WatchLen::new(1).expect("1 is a length"),
        Access::Write,
    );
    a.set_disabled(1);
    a
}

/// A signal stop's breakpoint: counts its hits (read from its fd) and runs
/// the program sending the signal; no samples, removed at exec.
pub fn signal_stop(addr: u64, len: WatchLen, access: Access) -> b::perf_event_attr {
    let mut a = b::perf_event_attr {
        type_: b::PERF_TYPE_BREAKPOINT,
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        ..Default::default()
    };
    a.bp_type = bp_type(access);
    a.__bindgen_anon_3.bp_addr = addr;
    a.__bindgen_anon_4.bp_len = crate::arch::current::perf_bp_len(len, access);
    a.__bindgen_anon_1.sample_period = 1;
    a.set_exclude_kernel(1);
    a.set_exclude_hv(1);
    a.set_remove_on_exec(1);
    a
}

/// A uprobe on the instruction at file offset `offset` of the file at
/// `path` (a return probe: the function's return, with `retprobe`, the
/// `config` bit `/sys/bus/event_source/devices/uprobe/format/retprobe`
/// names) of the uprobe PMU `pmu` (its `type` file): it only runs the BPF
/// program attached to it, counts nothing the daemon reads and samples
/// nothing. `path` must outlive the `perf_event_open` call.
pub fn uprobe(
    pmu: u32,
    path: &std::ffi::CStr,
    offset: u64,
    retprobe: Option<u32>,
) -> b::perf_event_attr {
    let mut a = b::perf_event_attr {
        type_: pmu,
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        ..Default::default()
    };
    a.config = retprobe.map_or(0, |bit| 1u64 << bit);
    a.__bindgen_anon_3.config1 = path.as_ptr() as u64;
    a.__bindgen_anon_4.config2 = offset;
    a.__bindgen_anon_1.sample_period = 1;
    a.set_exclude_kernel(1);
    a.set_exclude_hv(1);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(addr: u64, len: u32) -> Piece {
        Piece {
            addr,
            len: WatchLen::new(len).unwrap(),
        }
    }

    /// Every event sharing a ring: the same sample fields and trailer,
    /// user space only, CLOCK_MONOTONIC.
    fn shares_rings(a: &b::perf_event_attr) {
        assert_eq!(a.size as usize, std::mem::size_of::<b::perf_event_attr>());
        // The fields a sample may add come after those every record
        // carries (`sample_id_all`'s trailer has neither).
        let added = u64::from(b::PERF_SAMPLE_CALLCHAIN | b::PERF_SAMPLE_REGS_USER);
        assert_eq!(a.sample_type & !added, SAMPLE_TYPE);
        assert_eq!(a.sample_id_all(), 1);
        assert_eq!((a.exclude_kernel(), a.exclude_hv()), (1, 1));
        assert_eq!((a.use_clockid(), a.clockid), (1, libc::CLOCK_MONOTONIC));
        assert_eq!(a.read_format, u64::from(b::PERF_FORMAT_LOST));
    }

    #[test]
    fn collectors_see_tasks_only_on_the_per_thread_path() {
        for see_tasks in [false, true] {
            let a = collector(see_tasks, 512 * 1024);
            shares_rings(&a);
            assert_eq!(a.type_, b::PERF_TYPE_SOFTWARE);
            assert_eq!(a.config, u64::from(b::PERF_COUNT_SW_DUMMY));
            assert_eq!(a.watermark(), 1);
            // SAFETY: a plain integer in a union written above.
            assert_eq!(unsafe { a.__bindgen_anon_2.wakeup_watermark }, 512 * 1024);
            let t = u64::from(see_tasks);
            assert_eq!((a.task(), a.comm(), a.comm_exec()), (t, t, t));
            assert_eq!((a.inherit(), a.disabled()), (0, 0));
        }
    }

    #[test]
    fn trackers_follow_threads_not_forks() {
        let a = tracker();
        shares_rings(&a);
        assert_eq!(a.type_, b::PERF_TYPE_SOFTWARE);
        assert_eq!((a.task(), a.comm(), a.comm_exec()), (1, 1, 1));
        assert_eq!((a.inherit(), a.inherit_thread()), (1, 1));
    }

    #[test]
    fn breakpoints_watch_the_piece_and_its_access() {
        for (access, ty) in [
            (Access::Write, b::HW_BREAKPOINT_W),
            (Access::ReadWrite, b::HW_BREAKPOINT_RW),
            (Access::Exec, b::HW_BREAKPOINT_X),
        ] {
            let len = if access == Access::Exec { 1 } else { 4 };
            let a = breakpoint(0x7000, WatchLen::new(len).unwrap(), access);
            assert_eq!((a.type_, a.bp_type), (b::PERF_TYPE_BREAKPOINT, ty));
            // SAFETY: plain integers in unions written above.
            let (addr, bp_len) = unsafe { (a.__bindgen_anon_3.bp_addr, a.__bindgen_anon_4.bp_len) };
            assert_eq!(addr, 0x7000);
            assert_eq!(
                bp_len,
                crate::arch::current::perf_bp_len(WatchLen::new(len).unwrap(), access)
            );
        }
    }

    #[test]
    fn per_cpu_breakpoints_sample_each_hit_with_a_chain_when_asked() {
        let chain = u64::from(b::PERF_SAMPLE_CALLCHAIN);
        let regs = u64::from(b::PERF_SAMPLE_REGS_USER);
        for inherit in [Inherit::No, Inherit::Threads, Inherit::ThreadsAndForks] {
            let a = sampled_breakpoint(piece(0x7008, 8), Access::Exec, inherit, (0, 127), true);
            shares_rings(&a);
            // SAFETY: a plain integer in a union written above.
            assert_eq!(unsafe { a.__bindgen_anon_1.sample_period }, 1);
            assert_eq!(a.remove_on_exec(), 1);
            assert_eq!(a.sample_type, SAMPLE_TYPE, "no call chain, no registers");
            let want = match inherit {
                Inherit::No => (0, 0),
                Inherit::Threads => (1, 1),
                Inherit::ThreadsAndForks => (1, 0),
            };
            assert_eq!((a.inherit(), a.inherit_thread()), want, "{inherit:?}");
        }
        let a = sampled_breakpoint(piece(0x7008, 8), Access::Exec, Inherit::No, (16, 127), true);
        assert_eq!(a.sample_type, SAMPLE_TYPE | chain);
        assert_eq!(a.exclude_callchain_kernel(), 1);
        assert_eq!(a.sample_max_stack, 17, "the callers and the hit's own ip");
        let a = sampled_breakpoint(
            piece(0x7008, 8),
            Access::Write,
            Inherit::No,
            (500, 127),
            true,
        );
        assert_eq!(a.sample_max_stack, 127, "within the kernel's limit");
        // A store's registers, with a chain of the ip alone when no caller
        // is asked for: the chain is there whenever the registers are.
        for access in [Access::Write, Access::ReadWrite] {
            let a = sampled_breakpoint(piece(0x7008, 8), access, Inherit::Threads, (0, 127), true);
            shares_rings(&a);
            assert_eq!(a.sample_type, SAMPLE_TYPE | chain | regs, "{access:?}");
            assert_eq!(a.sample_max_stack, 1, "{access:?}");
            assert_eq!(
                a.sample_regs_user,
                crate::arch::current::perf_regs::SAMPLE_MASK
            );
            // Not asked for (an aggregate watchpoint): neither.
            let a = sampled_breakpoint(piece(0x7008, 8), access, Inherit::Threads, (0, 127), false);
            assert_eq!(a.sample_type, SAMPLE_TYPE, "{access:?}");
        }
    }

    #[test]
    fn per_thread_breakpoints_run_their_program_without_samples_of_their_own() {
        let a = program_breakpoint(piece(0x7000, 2), Access::ReadWrite, Inherit::Threads);
        // SAFETY: plain integers in unions written above.
        unsafe {
            assert_eq!(a.__bindgen_anon_1.sample_period, 1);
            assert_eq!(a.__bindgen_anon_4.bp_len, 2);
        }
        assert_eq!(a.bp_type, b::HW_BREAKPOINT_RW);
        assert_eq!(
            (a.remove_on_exec(), a.inherit(), a.inherit_thread()),
            (1, 1, 1)
        );
        assert_eq!(a.sample_type & u64::from(b::PERF_SAMPLE_CALLCHAIN), 0);
        assert_eq!(a.disabled(), 0);
    }

    #[test]
    fn the_probe_holds_a_slot_without_counting() {
        let a = probe();
        assert_eq!((a.type_, a.disabled()), (b::PERF_TYPE_BREAKPOINT, 1));
    }

    #[test]
    fn signal_stops_count_and_write_nothing() {
        let a = signal_stop(0x7000, WatchLen::new(8).unwrap(), Access::Write);
        assert_eq!(
            (a.type_, a.bp_type),
            (b::PERF_TYPE_BREAKPOINT, b::HW_BREAKPOINT_W)
        );
        assert_eq!(a.sample_type, 0);
        assert_eq!(
            (a.exclude_kernel(), a.remove_on_exec(), a.inherit()),
            (1, 1, 0)
        );
        // SAFETY: plain integers in unions written above.
        unsafe {
            assert_eq!(a.__bindgen_anon_1.sample_period, 1);
            assert_eq!(a.__bindgen_anon_4.bp_len, 8);
        }
        // An exec breakpoint's length is the architecture's (on x86-64 the
        // kernel refuses any but sizeof(long)).
        let one = WatchLen::new(1).unwrap();
        let a = signal_stop(0x7000, one, Access::Exec);
        // SAFETY: a plain integer in a union written above.
        let bp_len = unsafe { a.__bindgen_anon_4.bp_len };
        assert_eq!(bp_len, crate::arch::current::perf_bp_len(one, Access::Exec));
    }
}
