//! Signals the kernel delivers to watched processes, seen as they are
//! delivered: a BPF program on the `signal:signal_deliver` tracepoint
//! (attached through one perf event; it runs on every CPU) writes every delivery whose action is the default
//! one (the process dies of it, or stops) and every SIGTRAP (handled or
//! not) into a small BPF ring; the core reads it (`core/crashes.rs`).
//!
//! Why: a process wpd watches must never die of wpd, and wpd sends no
//! SIGTRAP (kernel-facts §10). Yet the kernel can deliver one to a task
//! whose breakpoints are perf events when the debug-status register (DR6)
//! it reads at the trap names no installed breakpoint, or nothing at all —
//! which a hypervisor that loses a guest's DR6 across a VM exit makes
//! happen whatever wpd does. Seen at delivery, such a trap is reported with
//! its `si_code` and what it means, instead of a target that just vanished;
//! and any other fatal signal of a watched process (a crash, a sanitizer's
//! abort) is reported the same way.
//!
//! Needs `bpf()`, perf tracepoints and tracefs (`/sys/kernel/tracing`, or
//! under debugfs) for the tracepoint's id and record layout; without them
//! nothing is seen, and `GetCapabilities` would say why.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use crate::bpf::{self, Insn, Program, RingBuf, asm, helper};
use crate::model::{Pid, Tid};

/// Ring size: signals worth reporting are rare (a crash storm of a fuzzer
/// is a few thousand a second at most).
const RING_BYTES: usize = 256 << 10;

/// Record layout written by the program (all u64, native order).
const REC_BYTES: i32 = 32;

/// `SIGTRAP`.
pub const SIGTRAP: i32 = 5;

/// A signal delivery as the program recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivery {
    /// Process (thread group) that received it.
    pub pid: Pid,
    /// Thread that took it.
    pub tid: Tid,
    /// Signal number.
    pub signal: i32,
    /// `si_code`.
    pub code: i32,
    /// The action was the default one (`SIG_DFL`): for most signals, death.
    pub default_action: bool,
}

/// Why signal deliveries cannot be seen here.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unseen {
    /// No tracefs: the tracepoint's id and layout are unknown.
    #[error("tracefs is not mounted (/sys/kernel/tracing): signal deliveries are not seen")]
    NoTracefs,
    /// The tracepoint's format is not as expected.
    #[error("signal:signal_deliver has an unexpected format: {0}")]
    Format(String),
    /// `bpf()` or `perf_event_open()` refused.
    #[error("{what}: {errno}")]
    Refused { what: &'static str, errno: Errno },
}

/// Offsets of the fields the program reads in the tracepoint's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    sig: i16,
    code: i16,
    handler: i16,
}

/// The tracepoint's directory under tracefs.
fn tracepoint_dir() -> Option<std::path::PathBuf> {
    [
        "/sys/kernel/tracing/events/signal/signal_deliver",
        "/sys/kernel/debug/tracing/events/signal/signal_deliver",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.join("id").exists())
}

/// Reads `field:<type> <name>;\toffset:N;\tsize:S;` lines of a format file.
fn parse_layout(format: &str) -> Result<Layout, Unseen> {
    let field = |name: &str, size: u32| -> Result<i16, Unseen> {
        for line in format.lines() {
            let line = line.trim();
            let Some(decl) = line.strip_prefix("field:") else {
                continue;
            };
            let mut parts = decl.split(';');
            let ty_name = parts.next().unwrap_or("");
            if ty_name.rsplit(' ').next() != Some(name) {
                continue;
            }
            let mut off = None;
            let mut sz = None;
            for p in parts {
                let p = p.trim();
                if let Some(v) = p.strip_prefix("offset:") {
                    off = v.parse::<i16>().ok();
                } else if let Some(v) = p.strip_prefix("size:") {
                    sz = v.parse::<u32>().ok();
                }
            }
            return match (off, sz) {
                (Some(o), Some(s)) if s == size && o >= 0 && o % (s as i16) == 0 => Ok(o),
                _ => Err(Unseen::Format(format!("field {name}: {line}"))),
            };
        }
        Err(Unseen::Format(format!("no field {name}")))
    };
    Ok(Layout {
        sig: field("sig", 4)?,
        code: field("code", 4)?,
        handler: field("sa_handler", 8)?,
    })
}

/// The program: a delivery whose handler is `SIG_DFL`, or of SIGTRAP, is
/// written to `ring` as (pid_tgid, signal, code, handler).
fn program(ring: &RingBuf, l: Layout) -> Result<Vec<Insn>, bpf::AsmError> {
    let mut p = Program::new();
    let (keep, out) = (p.label(), p.label());
    p.push([
        asm::mov(6, 1),
        asm::ldx_w(7, 6, l.sig),
        asm::ldx_dw(8, 6, l.handler),
    ]);
    // Default action: kept; a handled or ignored SIGTRAP too; anything
    // else is not.
    p.jeq_imm(8, 0, keep);
    p.jne_imm(7, SIGTRAP, out);
    p.place(keep);
    p.push(asm::ld_map(1, ring.raw_fd()));
    p.push([
        asm::mov_imm(2, REC_BYTES),
        asm::mov_imm(3, 0),
        asm::call(helper::RINGBUF_RESERVE),
    ]);
    p.jeq_imm(0, 0, out);
    p.push([asm::mov(9, 0)]);
    // Ids in the daemon's namespace: a task of another one (not watched:
    // the daemon sees its watched processes in its own) records 0.
    p.push(bpf::current_pid_tgid(crate::pidns::own(), -8));
    p.push([
        asm::stx_dw(9, 0, 0),
        asm::stx_dw(9, 8, 7),
        asm::ldx_w(1, 6, l.code),
        asm::stx_dw(9, 16, 1),
        asm::stx_dw(9, 24, 8),
        asm::mov(1, 9),
        asm::mov_imm(2, 0),
        asm::call(helper::RINGBUF_SUBMIT),
    ]);
    p.place(out);
    p.push([asm::mov_imm(0, 0), asm::exit()]);
    p.build()
}

/// Decodes one record.
fn parse(body: &[u8]) -> Option<Delivery> {
    if body.len() < REC_BYTES as usize {
        return None;
    }
    let w = |i: usize| u64::from_ne_bytes(body[i * 8..i * 8 + 8].try_into().unwrap());
    let pid_tgid = w(0);
    Some(Delivery {
        pid: (pid_tgid >> 32) as Pid,
        tid: pid_tgid as u32 as Tid,
        signal: w(1) as i32,
        code: w(2) as i32,
        default_action: w(3) == 0,
    })
}

/// The running watch: the ring, and the tracepoint event that keeps the
/// program attached.
#[derive(Debug)]
pub struct SignalWatch {
    ring: RingBuf,
    _events: Vec<OwnedFd>,
    _prog: OwnedFd,
}

impl SignalWatch {
    /// Attaches the program to `signal:signal_deliver`.
    pub fn start() -> Result<SignalWatch, Unseen> {
        let dir = tracepoint_dir().ok_or(Unseen::NoTracefs)?;
        let id: u64 = std::fs::read_to_string(dir.join("id"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or(Unseen::NoTracefs)?;
        let format = std::fs::read_to_string(dir.join("format")).map_err(|_| Unseen::NoTracefs)?;
        let layout = parse_layout(&format)?;
        let ring = RingBuf::new(RING_BYTES).map_err(|errno| Unseen::Refused {
            what: "bpf(BPF_MAP_CREATE) of a ring buffer",
            errno,
        })?;
        let insns = program(&ring, layout).map_err(|e| Unseen::Format(e.to_string()))?;
        let prog =
            bpf::load_program(bpf::PROG_TYPE_TRACEPOINT, &insns).map_err(|e| Unseen::Refused {
                what: "bpf(BPF_PROG_LOAD) of the signal tracepoint program",
                errno: e.errno,
            })?;
        // A tracepoint's programs belong to the tracepoint: attached through
        // one event, the program runs wherever the tracepoint fires (the same
        // program cannot be attached twice: EEXIST).
        let cpu = crate::cpus::online().first().copied().unwrap_or(0);
        let events = vec![open_tracepoint(id, cpu as i32, &prog)?];
        Ok(SignalWatch {
            ring,
            _events: events,
            _prog: prog,
        })
    }

    /// Takes every delivery recorded since the last call.
    pub fn drain(&self, out: &mut Vec<Delivery>) {
        self.ring.consume(&mut |body| {
            if let Some(d) = parse(body) {
                out.push(d);
            }
        });
    }
}

/// A tracepoint event on `cpu` (every task), with `prog` attached.
fn open_tracepoint(id: u64, cpu: i32, prog: &OwnedFd) -> Result<OwnedFd, Unseen> {
    use perf_event_open_sys::bindings as b;
    let mut attr = b::perf_event_attr {
        type_: b::PERF_TYPE_TRACEPOINT,
        size: std::mem::size_of::<b::perf_event_attr>() as u32,
        config: id,
        ..Default::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    attr.sample_type = b::PERF_SAMPLE_RAW as u64;
    // SAFETY: attr is a valid perf_event_attr; the fd returned is ours.
    let fd = unsafe {
        perf_event_open_sys::perf_event_open(
            &mut attr,
            -1,
            cpu,
            -1,
            b::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(Unseen::Refused {
            what: "perf_event_open of signal:signal_deliver",
            errno: Errno::last(),
        });
    }
    // SAFETY: a new fd the kernel just gave us.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: PERF_EVENT_IOC_SET_BPF takes the program's fd by value.
    if unsafe { perf_event_open_sys::ioctls::SET_BPF(fd.as_raw_fd(), prog.as_raw_fd() as u32) } < 0
    {
        return Err(Unseen::Refused {
            what: "attaching the signal tracepoint program",
            errno: Errno::last(),
        });
    }
    Ok(fd)
}

/// The signal of a signal action (`WatchpointSpec.signal`; 0: SIGABRT), or
/// why it cannot be one: it must be a signal a process can catch and that
/// is not job control, and not SIGTRAP (libFuzzer does not treat SIGTRAP as
/// a crash, and debuggers own it).
pub fn action_signal(n: i32) -> Result<i32, String> {
    let n = if n == 0 { libc::SIGABRT } else { n };
    if !(1..=64).contains(&n) {
        return Err(format!("signal {n} is not a signal number (1 to 64)"));
    }
    let why = match n {
        libc::SIGTRAP => Some(
            "debuggers own it, and libFuzzer does not count it as a crash (SIGABRT, the \
             default, is what AFL++, libFuzzer and honggfuzz all save an input for)",
        ),
        libc::SIGKILL => Some("it cannot be caught: no crash handler or sanitizer runs"),
        libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU | libc::SIGCONT => {
            Some("it is job control, not a crash")
        }
        libc::SIGCHLD | libc::SIGURG | libc::SIGWINCH => Some("its default action is to ignore it"),
        _ => None,
    };
    match why {
        Some(why) => Err(format!("{} cannot be the action's signal: {why}", name(n))),
        None => Ok(n),
    }
}

/// Whether `pid` can take signal `n` now: not ignored (`SigIgn`) and
/// blocked by none of its threads (their settled `SigBlk`, see
/// [`crate::procfs::settled_sigmask`]); else why not. A thread counts as
/// blocking only if it does in three looks 2 ms apart.
pub fn deliverable(pid: Pid, n: i32) -> Result<(), String> {
    let bit = 1u64 << (n - 1);
    let st = crate::procfs::Status::of(pid).ok_or_else(|| format!("no process {pid}"))?;
    if st.mask("SigIgn").is_some_and(|m| m & bit != 0) {
        return Err(format!(
            "process {pid} ignores {}: the action's signal would do nothing",
            name(n)
        ));
    }
    let mut blocking: Option<Vec<crate::model::Tid>> = None;
    for look in 0..3 {
        if look > 0 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let now: Vec<crate::model::Tid> = crate::procfs::tasks(pid)
            .unwrap_or_default()
            .into_iter()
            .filter(|&tid| crate::procfs::settled_sigmask(pid, tid).is_some_and(|m| m & bit != 0))
            .collect();
        let b = match blocking {
            None => now,
            Some(prev) => prev.into_iter().filter(|t| now.contains(t)).collect(),
        };
        if b.is_empty() {
            return Ok(());
        }
        blocking = Some(b);
    }
    let tid = blocking.unwrap_or_default().first().copied().unwrap_or(0);
    Err(format!(
        "thread {tid} of process {pid} blocks {}: the action's signal would wait there instead \
         of ending the run at the hit",
        name(n)
    ))
}

/// The name of signal `n` (`SIGTRAP`), or `signal N`.
pub fn name(n: i32) -> String {
    nix::sys::signal::Signal::try_from(n).map_or_else(|_| format!("signal {n}"), |s| s.to_string())
}

/// Whether the default action of `sig` ends the process (terminate or core
/// dump), as opposed to ignore, stop or continue.
pub fn fatal_by_default(sig: i32) -> bool {
    !matches!(
        sig,
        libc::SIGCHLD
            | libc::SIGCONT
            | libc::SIGSTOP
            | libc::SIGTSTP
            | libc::SIGTTIN
            | libc::SIGTTOU
            | libc::SIGURG
            | libc::SIGWINCH
    )
}

/// What the kernel's `si_code` says of a SIGTRAP (kernel-facts §10).
pub fn sigtrap_cause(code: i32) -> &'static str {
    match code {
        // TRAP_BRKPT from a debug exception is the kernel's reading of an
        // empty DR6 (an ICEBP, or a debug status a hypervisor lost).
        1 => {
            "TRAP_BRKPT: a breakpoint trap with no cause in the debug status register (DR6): \
             an ICEBP instruction, or a debug status lost by the hypervisor (a KVM guest before \
             Linux 6.14's fix loads a stale DR6 after some VM exits); wpd sends no SIGTRAP"
        }
        2 => "TRAP_TRACE: a single step (the trap flag was set by the program or a debugger)",
        3 => "TRAP_BRANCH: a branch trap (block stepping by a debugger)",
        4 => {
            "TRAP_HWBKPT: the debug status register (DR6) named a hardware breakpoint slot with \
             no breakpoint installed: a ptrace-set debug register, or a stale DR6 from the \
             hypervisor (KVM before Linux 6.14 could load one after a VM exit); wpd's perf \
             breakpoints are claimed by the kernel and send no signal"
        }
        6 => "TRAP_PERF: a perf event with `sigtrap` set (not one of wpd's)",
        0x80 => "SI_KERNEL: an int3 instruction in the program (a software breakpoint)",
        0 => "SI_USER: sent by a process with kill(2)",
        -6 => "SI_TKILL: sent by a process with tgkill(2)",
        _ => "an unusual si_code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_read_from_the_format_file() {
        let f = "name: signal_deliver\nID: 260\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
            \tfield:int sig;\toffset:8;\tsize:4;\tsigned:1;\n\
            \tfield:int errno;\toffset:12;\tsize:4;\tsigned:1;\n\
            \tfield:int code;\toffset:16;\tsize:4;\tsigned:1;\n\
            \tfield:unsigned long sa_handler;\toffset:24;\tsize:8;\tsigned:0;\n\
            \tfield:unsigned long sa_flags;\toffset:32;\tsize:8;\tsigned:0;\n";
        assert_eq!(
            parse_layout(f).unwrap(),
            Layout {
                sig: 8,
                code: 16,
                handler: 24
            }
        );
        assert!(parse_layout("field:int sig;\toffset:8;\tsize:4;").is_err());
        assert!(parse_layout(&f.replace("size:8", "size:4")).is_err());
    }

    #[test]
    fn records_decode() {
        let mut b = Vec::new();
        for v in [(7u64 << 32) | 9, 5, 4, 0] {
            b.extend_from_slice(&v.to_ne_bytes());
        }
        assert_eq!(
            parse(&b),
            Some(Delivery {
                pid: 7,
                tid: 9,
                signal: 5,
                code: 4,
                default_action: true
            })
        );
        assert_eq!(parse(&b[..16]), None);
    }

    #[test]
    fn the_programs_jumps_land_on_the_exit_and_on_the_ring_write() {
        // Built against a real ring where bpf() is allowed; the verifier
        // checks every jump target.
        let Ok(ring) = RingBuf::new(RING_BYTES) else {
            eprintln!("skipped: bpf() refused here");
            return;
        };
        let l = Layout {
            sig: 8,
            code: 16,
            handler: 24,
        };
        let r = bpf::load_program(bpf::PROG_TYPE_TRACEPOINT, &program(&ring, l).unwrap());
        assert!(r.is_ok(), "{r:?}");
    }
}
