//! The perf syscalls wpd makes — `perf_event_open` and the four ioctls it
//! uses — all through one function, [`call`], which a unit test can replace
//! on its own thread ([`test::intercept`]): the events each path opens are
//! then checked, attribute by attribute, without root and without a kernel
//! that has breakpoints to give.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use perf_event_open_sys as sys;
use sys::bindings as b;

/// A kernel refusal from a perf syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{op} refused: {}", errno.desc())]
pub struct PerfError {
    /// Which call.
    pub op: &'static str,
    /// The errno.
    pub errno: Errno,
}

/// One perf syscall.
#[derive(Debug)]
pub(in crate::backend) enum Call<'a> {
    /// `perf_event_open(attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)`.
    Open {
        attr: &'a mut b::perf_event_attr,
        pid: i32,
        cpu: i32,
    },
    /// `PERF_EVENT_IOC_ID`: the event's id, as samples carry it.
    Id { fd: RawFd, id: &'a mut u64 },
    /// `PERF_EVENT_IOC_SET_OUTPUT`: the event writes into `to`'s ring.
    SetOutput { fd: RawFd, to: RawFd },
    /// `PERF_EVENT_IOC_SET_BPF`: the event runs program `prog` at each
    /// overflow.
    SetBpf { fd: RawFd, prog: RawFd },
    /// `PERF_EVENT_IOC_ENABLE`: an event opened disabled starts counting.
    Enable { fd: RawFd },
}

/// Makes `c`: a new fd for [`Call::Open`], 0 for an ioctl, or the errno.
pub(in crate::backend) fn call(c: Call<'_>) -> Result<i32, Errno> {
    #[cfg(test)]
    let mut c = c;
    #[cfg(test)]
    if let Some(r) = test::intercepted(&mut c) {
        return r;
    }
    // SAFETY: each arm passes the kernel what it expects: a fully
    // initialised perf_event_attr of its own size, fds of perf events (and
    // of a BPF program), a valid out pointer for the id.
    let r = unsafe {
        match c {
            Call::Open { attr, pid, cpu } => sys::perf_event_open(
                attr,
                pid,
                cpu,
                -1,
                libc::c_ulong::from(b::PERF_FLAG_FD_CLOEXEC),
            ),
            Call::Id { fd, id } => sys::ioctls::ID(fd, id),
            Call::SetOutput { fd, to } => sys::ioctls::SET_OUTPUT(fd, to),
            Call::SetBpf { fd, prog } => sys::ioctls::SET_BPF(fd, prog as u32),
            Call::Enable { fd } => sys::ioctls::ENABLE(fd, 0),
        }
    };
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

/// Opens an event on thread `pid` (-1: every task) and CPU `cpu` (-1:
/// every CPU); `op` names the call in a refusal.
pub(in crate::backend) fn open(
    attr: &mut b::perf_event_attr,
    pid: i32,
    cpu: i32,
    op: &'static str,
) -> Result<OwnedFd, PerfError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// The kernel refused `PERF_FORMAT_LOST` once (before Linux 6.0).
    static NO_LOST_FORMAT: AtomicBool = AtomicBool::new(false);
    let lost = u64::from(b::PERF_FORMAT_LOST);
    if NO_LOST_FORMAT.load(Ordering::Relaxed) {
        attr.read_format &= !lost;
    }
    let fd = match call(Call::Open { attr, pid, cpu }) {
        Err(Errno::EINVAL) if attr.read_format & lost != 0 => {
            attr.read_format &= !lost;
            let fd =
                call(Call::Open { attr, pid, cpu }).map_err(|errno| PerfError { op, errno })?;
            if !NO_LOST_FORMAT.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the kernel does not count the samples each perf event loses \
                     (PERF_FORMAT_LOST, Linux 6.0): a full ring's losses are counted when \
                     its PERF_RECORD_LOST comes"
                );
            }
            fd
        }
        r => r.map_err(|errno| PerfError { op, errno })?,
    };
    // SAFETY: a fresh descriptor, ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The samples `fd`'s event lost because its ring was full, counted by the
/// kernel as it drops them (`PERF_FORMAT_LOST`, read through `read(2)`:
/// the count, then the losses). None for an event opened without it.
pub(in crate::backend) fn lost(fd: RawFd) -> Option<u64> {
    let mut v = [0u64; 2];
    // SAFETY: reads at most 16 bytes into a live 16-byte buffer.
    let n = unsafe { libc::read(fd, v.as_mut_ptr().cast(), std::mem::size_of_val(&v)) };
    (n == 16).then_some(v[1])
}

/// The id samples of `fd`'s event (and of its inherited copies) carry.
pub(super) fn id(fd: &OwnedFd) -> Result<u64, PerfError> {
    let mut id = 0u64;
    call(Call::Id {
        fd: fd.as_raw_fd(),
        id: &mut id,
    })
    .map_err(|errno| PerfError {
        op: "PERF_EVENT_IOC_ID",
        errno,
    })?;
    Ok(id)
}

/// Redirects `fd`'s records into the ring of `collector` (same CPU).
pub(super) fn set_output(fd: &OwnedFd, collector: RawFd) -> Result<(), PerfError> {
    call(Call::SetOutput {
        fd: fd.as_raw_fd(),
        to: collector,
    })
    .map(drop)
    .map_err(|errno| PerfError {
        op: "PERF_EVENT_IOC_SET_OUTPUT",
        errno,
    })
}

/// Attaches program `prog` to `fd`'s event.
pub(in crate::backend) fn set_bpf(fd: &impl AsRawFd, prog: &impl AsRawFd) -> Result<(), PerfError> {
    call(Call::SetBpf {
        fd: fd.as_raw_fd(),
        prog: prog.as_raw_fd(),
    })
    .map(drop)
    .map_err(|errno| PerfError {
        op: "PERF_EVENT_IOC_SET_BPF",
        errno,
    })
}

/// Enables `fd`'s event (opened disabled).
pub(in crate::backend) fn enable(fd: &impl AsRawFd) -> Result<(), PerfError> {
    call(Call::Enable { fd: fd.as_raw_fd() })
        .map(drop)
        .map_err(|errno| PerfError {
            op: "PERF_EVENT_IOC_ENABLE",
            errno,
        })
}

/// Replacing [`call`] in unit tests.
#[cfg(test)]
pub(in crate::backend) mod test {
    use std::cell::RefCell;
    use std::os::fd::{IntoRawFd, RawFd};

    use nix::errno::Errno;

    use super::{Call, b};

    /// A call as the replacement saw it.
    #[derive(Debug, Clone)]
    pub enum Made {
        Open {
            attr: b::perf_event_attr,
            pid: i32,
            cpu: i32,
            /// The fd handed back.
            fd: RawFd,
        },
        Id {
            fd: RawFd,
        },
        SetOutput {
            fd: RawFd,
            to: RawFd,
        },
        SetBpf {
            fd: RawFd,
            prog: RawFd,
        },
        Enable {
            fd: RawFd,
        },
    }

    type Answer = Box<dyn FnMut(&Made) -> Result<(), Errno>>;

    thread_local! {
        static INTERCEPT: RefCell<Option<(Answer, Vec<Made>)>> = const { RefCell::new(None) };
    }

    /// Runs `body` with every perf syscall of this thread recorded and
    /// answered by `answer` instead of the kernel: an `Open` it accepts
    /// gets a real fd (of `/dev/null`, so that closing it is harmless), an
    /// `Id` the fd's number as id. Returns `body`'s result and the calls.
    pub fn intercept<T>(
        answer: impl FnMut(&Made) -> Result<(), Errno> + 'static,
        body: impl FnOnce() -> T,
    ) -> (T, Vec<Made>) {
        INTERCEPT.with(|i| *i.borrow_mut() = Some((Box::new(answer), Vec::new())));
        let out = body();
        let made = INTERCEPT
            .with(|i| i.borrow_mut().take())
            .map(|(_, m)| m)
            .unwrap_or_default();
        (out, made)
    }

    pub(super) fn intercepted(c: &mut Call<'_>) -> Option<Result<i32, Errno>> {
        INTERCEPT.with(|i| {
            let mut i = i.borrow_mut();
            let (answer, made) = i.as_mut()?;
            let mut m = match &*c {
                Call::Open { attr, pid, cpu } => Made::Open {
                    attr: **attr,
                    pid: *pid,
                    cpu: *cpu,
                    fd: -1,
                },
                Call::Id { fd, .. } => Made::Id { fd: *fd },
                Call::SetOutput { fd, to } => Made::SetOutput { fd: *fd, to: *to },
                Call::SetBpf { fd, prog } => Made::SetBpf {
                    fd: *fd,
                    prog: *prog,
                },
                Call::Enable { fd } => Made::Enable { fd: *fd },
            };
            let r = answer(&m).and_then(|()| match (&mut m, c) {
                (Made::Open { fd, .. }, _) => {
                    let f = std::fs::File::open("/dev/null").map_err(|_| Errno::EMFILE)?;
                    *fd = f.into_raw_fd();
                    Ok(*fd)
                }
                (Made::Id { fd }, Call::Id { id, .. }) => {
                    **id = *fd as u64;
                    Ok(0)
                }
                _ => Ok(0),
            });
            made.push(m);
            Some(r)
        })
    }
}
