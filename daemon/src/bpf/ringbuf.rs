//! A BPF ring buffer ([`RingBuf`]): programs on every CPU write records
//! into it, the daemon consumes them in order.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;

use super::{BPF_MAP_CREATE, MapCreateAttr, sys_bpf};

const MAP_TYPE_RINGBUF: u32 = 27;

/// A BPF ring buffer (`BPF_MAP_TYPE_RINGBUF`): many producers (programs on
/// every CPU), one consumer (the daemon), records in order of reservation.
/// The consumer maps the consumer position read-write, and the producer
/// position plus the data, mapped twice in a row so that a record wrapping
/// the end reads contiguously, read-only.
#[derive(Debug)]
pub struct RingBuf {
    fd: OwnedFd,
    size: usize,
    consumer: *mut u8,
    producer: *const u8,
    page: usize,
    /// Bytes consumed so far (mirrors the consumer position).
    read: AtomicU64,
}

// SAFETY: the mappings are owned by the RingBuf; the consumer position is
// written only by [`RingBuf::consume`], which callers serialise.
unsafe impl Send for RingBuf {}
// SAFETY: as above; the mappings are read with atomic loads.
unsafe impl Sync for RingBuf {}

const RINGBUF_BUSY: u32 = 1 << 31;
const RINGBUF_DISCARD: u32 = 1 << 30;
const RINGBUF_HDR: usize = 8;

impl RingBuf {
    /// A ring of `size` bytes (a power of two, at least a page).
    pub fn new(size: usize) -> Result<RingBuf, Errno> {
        let page = page_size();
        let size = size.max(page).next_power_of_two();
        let attr = MapCreateAttr {
            map_type: MAP_TYPE_RINGBUF,
            max_entries: size as u32,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &attr)?;
        // SAFETY: a new fd the kernel just gave us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: mapping the consumer page of our own ring-buffer map.
        let consumer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if consumer == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        // SAFETY: mapping the producer page and the data (twice) of the map.
        let producer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page + 2 * size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                page as libc::off_t,
            )
        };
        if producer == libc::MAP_FAILED {
            let e = Errno::last();
            // SAFETY: unmapping what was mapped above.
            unsafe { libc::munmap(consumer, page) };
            return Err(e);
        }
        Ok(RingBuf {
            fd,
            size,
            consumer: consumer.cast(),
            producer: producer.cast(),
            page,
            read: AtomicU64::new(0),
        })
    }

    /// Its fd, for [`asm::ld_map`](super::asm::ld_map) and polling.
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Its size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The producer position: bytes reserved in the ring so far, committed
    /// or not.
    pub fn produced(&self) -> u64 {
        // SAFETY: the producer position is a u64 at the start of its mapped
        // page, written by the kernel.
        let prod = unsafe { &*(self.producer as *const AtomicU64) };
        prod.load(Ordering::Acquire)
    }

    /// Bytes read so far: every record before this position was handed
    /// over (or discarded).
    pub fn consumed(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Hands every committed record reserved before the call to `sink` in
    /// order, then frees their space; stops at the first record still being
    /// written (the ones after it, committed or not, wait for a later
    /// call). Records reserved during the call wait for the next: a call
    /// ends even while producers write faster than `sink` reads (a chase
    /// of the producer position would not, holding its caller, and whoever
    /// waits for the caller, for as long as the stores go on). Returns how
    /// many. Callers serialise calls.
    pub fn consume(&self, sink: &mut dyn FnMut(&[u8])) -> usize {
        // SAFETY: the positions are u64s at the start of their mapped pages,
        // written by the kernel (producer) and by us (consumer).
        let prod = unsafe { &*(self.producer as *const AtomicU64) };
        // SAFETY: as above.
        let cons = unsafe { &*(self.consumer as *const AtomicU64) };
        let mut pos = cons.load(Ordering::Relaxed);
        let mut n = 0;
        let mask = (self.size - 1) as u64;
        // SAFETY: the data starts one page after the producer position.
        let data = unsafe { self.producer.add(self.page) };
        let end = prod.load(Ordering::Acquire);
        while pos < end {
            // SAFETY: the header is inside the (double-)mapped data.
            let hdr = unsafe { &*(data.add((pos & mask) as usize) as *const AtomicU64) };
            let len_word = hdr.load(Ordering::Acquire) as u32;
            if len_word & RINGBUF_BUSY != 0 {
                break;
            }
            let len = (len_word & !(RINGBUF_BUSY | RINGBUF_DISCARD)) as usize;
            if len_word & RINGBUF_DISCARD == 0 {
                // SAFETY: a committed record of `len` bytes follows its
                // header; the second mapping makes a wrapping one contiguous.
                let body = unsafe {
                    std::slice::from_raw_parts(data.add((pos & mask) as usize + RINGBUF_HDR), len)
                };
                sink(body);
                n += 1;
            }
            pos += ((RINGBUF_HDR + len + 7) & !7) as u64;
            // Release: every read of the record above happens before a
            // producer that reads this position (with acquire, in
            // `__bpf_ringbuf_reserve`) reuses its bytes. That is all it has
            // to order. libbpf's consumer stores the same way but also has
            // to re-check the producer position with a full barrier before
            // it sleeps, or it could sleep through a record whose producer
            // saw the old position and skipped the wake-up; wpd's programs
            // submit with `BPF_RB_NO_WAKEUP`, so no producer ever wakes
            // the consumer, and the drain polls on a timeout instead: no
            // wake-up can be lost.
            cons.store(pos, Ordering::Release);
        }
        self.read.store(pos, Ordering::Relaxed);
        n
    }
}

impl Drop for RingBuf {
    fn drop(&mut self) {
        // SAFETY: unmapping the two mappings made in `new`.
        unsafe {
            libc::munmap(self.consumer.cast(), self.page);
            libc::munmap(
                self.producer as *mut libc::c_void,
                self.page + 2 * self.size,
            );
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}
