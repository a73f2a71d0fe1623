//! Attaching a program: uprobes through a BPF link (`BPF_LINK_CREATE`), and
//! raw tracepoints (`BPF_RAW_TRACEPOINT_OPEN`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use super::{BPF_LINK_CREATE, BPF_RAW_TRACEPOINT_OPEN, sys_bpf};

/// `BPF_TRACE_UPROBE_MULTI` (`enum bpf_attach_type`, Linux 6.6): a
/// `BPF_PROG_TYPE_KPROBE` program attached to uprobes through a BPF link
/// ([`uprobe_link`]).
pub const TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's uprobes are return probes.
const UPROBE_MULTI_RETURN: u32 = 1;

/// `union bpf_attr` as BPF_LINK_CREATE reads it for
/// `BPF_TRACE_UPROBE_MULTI`.
#[repr(C)]
#[derive(Default)]
struct UprobeLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    uprobe_flags: u32,
    pid: u32,
    _pad: u32,
}

/// Attaches `prog` (loaded for [`TRACE_UPROBE_MULTI`]) to a uprobe at file
/// offset `offset` of `path` (a return probe with `ret`) that runs for
/// process `pid` only (the kernel matches its memory): a BPF link, whose
/// fd keeps it. Unlike a uprobe perf event, a link's close does not take
/// the kernel's trace-event mutex, so closes made at once share one RCU
/// grace period (kernel-facts §21).
pub fn uprobe_link(
    prog: &impl AsRawFd,
    path: &std::ffi::CStr,
    offset: u64,
    ret: bool,
    pid: i32,
) -> Result<OwnedFd, Errno> {
    let offsets = [offset];
    let attr = UprobeLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cnt: 1,
        uprobe_flags: if ret { UPROBE_MULTI_RETURN } else { 0 },
        pid: pid as u32,
        ..Default::default()
    };
    let fd = sys_bpf(BPF_LINK_CREATE, &attr)?;
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// [`uprobe_link`] of several instructions of one file at once, each
/// with its cookie (`bpf_get_attach_cookie`).
pub fn uprobe_multi_link(
    prog: &impl AsRawFd,
    path: &std::ffi::CStr,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
    pid: i32,
) -> Result<OwnedFd, Errno> {
    if offsets.is_empty() || cookies.len() != offsets.len() {
        return Err(Errno::EINVAL);
    }
    let attr = UprobeLinkAttr {
        prog_fd: prog.as_raw_fd() as u32,
        attach_type: TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        uprobe_flags: if ret { UPROBE_MULTI_RETURN } else { 0 },
        pid: pid as u32,
        ..Default::default()
    };
    let fd = sys_bpf(BPF_LINK_CREATE, &attr)?;
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `union bpf_attr` as BPF_RAW_TRACEPOINT_OPEN reads it.
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

/// Attaches `prog` (a
/// [`PROG_TYPE_RAW_TRACEPOINT`](super::PROG_TYPE_RAW_TRACEPOINT) program)
/// to the tracepoint `name` (e.g. `signal_deliver`) on every CPU, for as
/// long as the returned fd is open.
pub fn raw_tracepoint_open(name: &std::ffi::CStr, prog: &OwnedFd) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    let attr = RawTracepointAttr {
        name: name.as_ptr() as u64,
        prog_fd: prog.as_raw_fd() as u32,
        _pad: 0,
    };
    let fd = sys_bpf(BPF_RAW_TRACEPOINT_OPEN, &attr)?;
    // SAFETY: a new fd the kernel just gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
