//! The maps the daemon keeps for its programs: a hash map of u64s to
//! arrays of u64s ([`U64Map`]) and a one-element array of counters
//! ([`Counters`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use super::{
    BPF_MAP_CREATE, BPF_MAP_DELETE_ELEM, BPF_MAP_LOOKUP_ELEM, BPF_MAP_UPDATE_ELEM, MapCreateAttr,
    sys_bpf,
};

/// `BPF_F_NO_PREALLOC`: a hash map's entries are allocated as they are
/// added, not all at its creation.
const F_NO_PREALLOC: u32 = 1;

/// `union bpf_attr` as BPF_MAP_LOOKUP_ELEM reads it.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const MAP_TYPE_ARRAY: u32 = 2;
/// Bytes a hash map entry takes beyond its value, its 8-byte key
/// included: measured 104 per entry of 40-byte values (the fdinfo's
/// `memlock` after 100 entries), rounded up (kernel-facts §21).
pub const HASH_ENTRY_BYTES: u64 = 72;
const MAP_TYPE_HASH: u32 = 1;

/// A map of u64s to arrays of u64s a program looks up with
/// `bpf_map_lookup_elem` (`BPF_MAP_TYPE_HASH`, 8-byte keys, values of a
/// fixed number of u64s), kept by the daemon: a set whose members each
/// carry a value.
#[derive(Debug)]
pub struct U64Map {
    fd: OwnedFd,
    words: usize,
}

impl U64Map {
    /// An empty map of at most `max` entries, each value `words` u64s.
    /// Entries take kernel memory as they are added
    /// ([`U64Map::kernel_bytes`]), not all at creation.
    pub fn new(max: u32, words: usize) -> Result<U64Map, Errno> {
        let attr = MapCreateAttr {
            map_type: MAP_TYPE_HASH,
            key_size: 8,
            value_size: (8 * words) as u32,
            max_entries: max,
            map_flags: F_NO_PREALLOC,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &attr)?;
        // SAFETY: a new fd the kernel just gave us.
        Ok(U64Map {
            fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
            words,
        })
    }

    /// Its fd, for [`asm::ld_map`](super::asm::ld_map).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Most kernel memory a map of `max` entries of `words` u64s can hold:
    /// its bucket array (16 bytes per bucket, a power of two of them),
    /// the map itself, and `max` entries of at most [`HASH_ENTRY_BYTES`]
    /// plus the value (kernel-facts §21).
    pub fn kernel_bytes(max: u32, words: usize) -> u64 {
        let buckets = u64::from(max.max(1).next_power_of_two());
        16 * buckets + 1024 + u64::from(max) * (HASH_ENTRY_BYTES + 8 * words as u64)
    }

    /// Sets `k` to `v` (its first words; the others 0).
    pub fn insert(&self, k: u64, v: &[u64]) -> Result<(), Errno> {
        let mut value = vec![0u64; self.words];
        let n = v.len().min(self.words);
        value[..n].copy_from_slice(&v[..n]);
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const k) as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_UPDATE_ELEM, &attr).map(|_| ())
    }

    /// The value of `k`, if it is in the map.
    pub fn get(&self, k: u64) -> Option<Vec<u64>> {
        let mut value = vec![0u64; self.words];
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const k) as u64,
            value: value.as_mut_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_LOOKUP_ELEM, &attr).ok().map(|_| value)
    }

    /// Removes `k` (absent: nothing).
    pub fn remove(&self, k: u64) {
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const k) as u64,
            ..Default::default()
        };
        let _ = sys_bpf(BPF_MAP_DELETE_ELEM, &attr);
    }
}

/// A one-element array of u64 counters (`n` of them in its value).
#[derive(Debug)]
pub struct Counters {
    fd: OwnedFd,
    n: usize,
}

impl Counters {
    /// `n` u64 counters, all 0.
    pub fn new(n: usize) -> Result<Counters, Errno> {
        let attr = MapCreateAttr {
            map_type: MAP_TYPE_ARRAY,
            key_size: 4,
            value_size: (8 * n) as u32,
            max_entries: 1,
            ..Default::default()
        };
        let fd = sys_bpf(BPF_MAP_CREATE, &attr)?;
        // SAFETY: a new fd the kernel just gave us.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(Counters { fd, n })
    }

    /// Its fd, for [`asm::ld_map_value`](super::asm::ld_map_value).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// The counters now.
    pub fn read(&self) -> Vec<u64> {
        let key = 0u32;
        let mut out = vec![0u64; self.n];
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const key) as u64,
            value: out.as_mut_ptr() as u64,
            ..Default::default()
        };
        if sys_bpf(BPF_MAP_LOOKUP_ELEM, &attr).is_err() {
            out.fill(0);
        }
        out
    }
}

#[cfg(test)]
impl Counters {
    /// Sets the counters (tests feed a program its input through them).
    pub fn write(&self, v: &[u64]) -> Result<(), Errno> {
        let key = 0u32;
        let mut value = vec![0u64; self.n];
        let n = v.len().min(self.n);
        value[..n].copy_from_slice(&v[..n]);
        let attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd() as u32,
            key: (&raw const key) as u64,
            value: value.as_ptr() as u64,
            ..Default::default()
        };
        sys_bpf(BPF_MAP_UPDATE_ELEM, &attr).map(|_| ())
    }
}
