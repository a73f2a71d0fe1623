//! The collectors: per CPU one dummy event owning a mmapped perf ring into
//! which every other event of ours on that CPU writes, and reading the
//! records out of it (`perf_event_open(2)`, "MMAP layout").

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;

use nix::errno::Errno;
use perf_event_open_sys::bindings as b;

use super::attr;
use super::record::{Record, parse_record};
use super::sys::{self, PerfError};

/// Data pages per CPU ring (power of two). 512 × 4 KiB = 2 MiB per CPU,
/// about 37,000 hit records of 56 bytes.
const RING_DATA_PAGES: usize = 512;

/// Bytes of a ring's data area by default (4 KiB pages).
pub const RING_BYTES: usize = RING_DATA_PAGES * 4096;

/// One CPU's collector and its mapped ring.
pub struct Ring {
    /// The CPU.
    pub cpu: u32,
    /// The collector event (owning the ring).
    pub collector: OwnedFd,
    /// The collector is an event on the daemon's own thread (no privilege
    /// to watch every task of the CPU).
    pub own: bool,
    base: *mut u8,
    len: usize,
    data_off: usize,
    data_size: usize,
}

// SAFETY: the mapping is owned by the Ring and only accessed under the
// backend's ring mutex.
unsafe impl Send for Ring {}

impl Ring {
    /// Bytes of its data area.
    pub fn data_bytes(&self) -> usize {
        self.data_size
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len come from a successful mmap of this ring.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl Ring {
    /// Opens CPU `cpu`'s collector (seeing every task's lifecycle when
    /// `see_tasks`) and maps its ring, of `bytes` (a power of two; None:
    /// [`RING_DATA_PAGES`]).
    pub fn open(cpu: u32, see_tasks: bool, bytes: Option<usize>) -> Result<Ring, PerfError> {
        let page = page_size();
        let pages = bytes.map_or(RING_DATA_PAGES, |b| (b / page).max(1));
        // Wake the reader when a quarter of the ring is full; the drain
        // loop also polls on a short timeout for latency.
        let mut a = attr::collector(see_tasks, (pages * page / 4) as u32);
        // Every task on the CPU (CAP_PERFMON, or perf_event_paranoid < 1);
        // else, without privilege, an event on the daemon's own main thread
        // on that CPU: it records nothing itself, and the events of the
        // processes watched on that CPU write into its ring all the same (a
        // ring per CPU takes any task's events on its CPU; kernel-facts
        // §25.3).
        let (collector, own) = match sys::open(&mut a, -1, cpu as i32, "perf_event_open(collector)")
        {
            Err(e) if !see_tasks && matches!(e.errno, Errno::EACCES | Errno::EPERM) => {
                let fd = sys::open(
                    &mut a,
                    std::process::id() as i32,
                    cpu as i32,
                    "perf_event_open(collector, the daemon's own thread)",
                )?;
                (fd, true)
            }
            r => (r?, false),
        };
        let len = (pages + 1) * page;
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
                (page, pages * page)
            } else {
                (off, size)
            }
        };
        Ok(Ring {
            cpu,
            collector,
            own,
            base: base.cast(),
            len,
            data_off,
            data_size,
        })
    }

    /// Hands every complete record to `sink` (decoded; unknown kinds are
    /// skipped) and frees their space; returns how many were read.
    /// `scratch` holds a record while it is decoded.
    pub fn drain(&self, scratch: &mut Vec<u8>, sink: &mut dyn FnMut(Record)) -> usize {
        let meta = self.base as *mut b::perf_event_mmap_page;
        // SAFETY: the metadata page is mapped; data_head is written by the
        // kernel, read with acquire ordering as perf_event_open(2) requires.
        let head = unsafe {
            let h = std::ptr::read_volatile(&(*meta).data_head);
            std::sync::atomic::fence(Ordering::Acquire);
            h
        };
        // SAFETY: data_tail is ours to read and write.
        let mut tail = unsafe { std::ptr::read_volatile(&(*meta).data_tail) };
        // SAFETY: the data area follows the metadata page inside the mapping.
        let data = unsafe { self.base.add(self.data_off) };
        let size = self.data_size as u64;
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

/// Bytes of a page (a ring's smallest data area).
pub fn page_bytes() -> usize {
    page_size()
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_wrap_at_the_end_of_the_data_area() {
        let data: Vec<u8> = (0..16).collect();
        let mut out = [0u8; 6];
        // SAFETY: `data` is 16 readable bytes; 6 <= 16.
        unsafe { copy_wrapped(data.as_ptr(), 16, 16 + 13, &mut out) };
        assert_eq!(out, [13, 14, 15, 0, 1, 2]);
        // SAFETY: as above.
        unsafe { copy_wrapped(data.as_ptr(), 16, 2, &mut out) };
        assert_eq!(out, [2, 3, 4, 5, 6, 7]);
    }
}
