//! State feedback's one definition, shared by the daemon (which writes a
//! feedback breakpoint's `sig_data`) and the library preloaded into the
//! fuzzed program (whose `SIGTRAP` handler reads it at each store and
//! counts the value in the fuzzer's map): what `sig_data` carries
//! ([`Trap`]) and which byte a value counts in ([`Trap::byte`]).
//!
//! No allocation, no I/O: [`Trap::byte`] runs in a signal handler.

#![no_std]

/// How a watched value becomes coverage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Each distinct value (with the other variables' values, if any) is
    /// its own coverage.
    Values,
    /// A value in a higher bucket than any before is new coverage: a
    /// climbing counter, a depth (buckets: [`max_bucket`]).
    Max,
}

/// What the handler needs at a trap, packed into the breakpoint's
/// `sig_data` (64 bits; the trap gives the watched address itself, as
/// `si_addr`):
///
/// | bits | what |
/// |---|---|
/// | 0–46 | the address of another variable whose value joins the key (0: none) |
/// | 47–48 | log2 of its length (1, 2, 4 or 8 bytes) |
/// | 49–50 | log2 of the watched length |
/// | 51 | the mode (0 values, 1 max) |
/// | 52–62 | a tag: two watches' values count in different bytes |
/// | 63 | set: a trap of wpd's (other `sigtrap` events leave it clear, or are not ours to count) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trap {
    /// The mode.
    pub mode: Mode,
    /// Bytes watched (1, 2, 4 or 8).
    pub len: u8,
    /// Another variable's address and length (1, 2, 4 or 8), if any.
    pub with: Option<(u64, u8)>,
    /// The watch's tag (11 bits kept).
    pub tag: u16,
}

/// Bit 63 of `sig_data`: the trap is a feedback breakpoint's.
pub const OURS: u64 = 1 << 63;
/// Highest user address the `with` field holds (47 bits: x86-64's user
/// half).
pub const ADDR_MASK: u64 = (1 << 47) - 1;

fn log2_len(len: u8) -> Option<u64> {
    match len {
        1 => Some(0),
        2 => Some(1),
        4 => Some(2),
        8 => Some(3),
        _ => None,
    }
}

impl Trap {
    /// `sig_data` for this trap, or `None` if a length is not 1, 2, 4 or 8
    /// or the other variable's address does not fit.
    pub fn encode(&self) -> Option<u64> {
        let len = log2_len(self.len)?;
        let (with, with_len) = match self.with {
            Some((a, l)) if a != 0 && a <= ADDR_MASK => (a, log2_len(l)?),
            Some(_) => return None,
            None => (0, 0),
        };
        let mode = match self.mode {
            Mode::Values => 0,
            Mode::Max => 1,
        };
        Some(
            OURS | with
                | with_len << 47
                | len << 49
                | mode << 51
                | (u64::from(self.tag) & 0x7ff) << 52,
        )
    }

    /// The trap `sig_data` describes, if it is one of wpd's.
    pub fn decode(sig_data: u64) -> Option<Trap> {
        if sig_data & OURS == 0 {
            return None;
        }
        let with = sig_data & ADDR_MASK;
        Some(Trap {
            mode: if sig_data >> 51 & 1 == 1 {
                Mode::Max
            } else {
                Mode::Values
            },
            len: 1 << (sig_data >> 49 & 3),
            with: (with != 0).then_some((with, 1 << (sig_data >> 47 & 3))),
            tag: (sig_data >> 52 & 0x7ff) as u16,
        })
    }

    /// The bytes, among `room` bytes kept for feedback, that a store of
    /// `value` (with the other variable's `with_value`, 0 without one)
    /// marks: for [`Mode::Values`] its own byte ([`Trap::byte`]); for
    /// [`Mode::Max`] the bytes of every bucket up to `value`'s, so that a
    /// run's bytes are those of the buckets up to its highest value, and a
    /// run counts as new coverage exactly when its highest value is in a
    /// bucket no run reached before (a lower value never stored is not new).
    pub fn bytes(&self, value: u64, with_value: u64, room: u32) -> Bytes {
        let room = room.max(1);
        match self.mode {
            Mode::Values => Bytes {
                next: self.byte(value, with_value, room),
                left: 1,
                room,
            },
            Mode::Max => Bytes {
                next: (self.salt(with_value) % u64::from(room)) as u32,
                left: (max_bucket(value) + 1).min(room),
                room,
            },
        }
    }

    /// What places a trap's bytes in the room: its tag and the other
    /// variable's value.
    fn salt(&self, with_value: u64) -> u64 {
        mix(u64::from(self.tag).wrapping_mul(0xD6E8_FEB8_6659_FD93) ^ mix(with_value))
    }

    /// The byte, among `room` bytes kept for feedback, that `value`
    /// (with the other variable's `with_value`, 0 without one) counts in:
    /// for [`Mode::Max`], its bucket's (the highest of [`Trap::bytes`]).
    pub fn byte(&self, value: u64, with_value: u64, room: u32) -> u32 {
        let room = u64::from(room.max(1));
        let salt = self.salt(with_value);
        match self.mode {
            Mode::Values => (mix(value ^ salt) % room) as u32,
            Mode::Max => ((salt % room + u64::from(max_bucket(value))) % room) as u32,
        }
    }
}

/// The bytes a store marks ([`Trap::bytes`]): consecutive bytes of the
/// room, wrapping at its end.
#[derive(Debug, Clone)]
pub struct Bytes {
    next: u32,
    left: u32,
    room: u32,
}

impl Iterator for Bytes {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        if self.left == 0 {
            return None;
        }
        let b = self.next;
        self.left -= 1;
        self.next = (self.next + 1) % self.room;
        Some(b)
    }
}

/// A 64-bit mixer (the finaliser of splitmix64): every input bit moves
/// every output bit.
pub fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ x >> 31
}

/// The bucket of `v` for [`Mode::Max`], increasing with `v`: each value
/// below 16 its own, then four buckets per power of two (260 in all).
pub fn max_bucket(v: u64) -> u32 {
    if v < 16 {
        return v as u32;
    }
    let log = 63 - v.leading_zeros();
    let quarter = (v >> (log - 2)) & 3;
    16 + (log - 4) * 4 + quarter as u32
}

/// Reads the `len` (1, 2, 4, 8) bytes at `addr` as a little-endian
/// unsigned integer.
///
/// # Safety
/// `addr` must be readable for `len` bytes.
pub unsafe fn read_value(addr: u64, len: u8) -> u64 {
    // SAFETY: the caller's promise; volatile: the program's own variable,
    // read at the trap.
    unsafe {
        match len {
            1 => u64::from(core::ptr::read_volatile(addr as *const u8)),
            2 => u64::from(core::ptr::read_unaligned(addr as *const u16)),
            4 => u64::from(core::ptr::read_unaligned(addr as *const u32)),
            _ => core::ptr::read_unaligned(addr as *const u64),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn sig_data_round_trips() {
        for mode in [Mode::Values, Mode::Max] {
            for len in [1, 2, 4, 8] {
                for with in [
                    None,
                    Some((0x7fff_ffff_f000, 4)),
                    Some((0x5555_0000_1040, 1)),
                ] {
                    let t = Trap {
                        mode,
                        len,
                        with,
                        tag: 0x5a5,
                    };
                    let s = t.encode().unwrap();
                    assert_eq!(Trap::decode(s), Some(t));
                }
            }
        }
        assert_eq!(Trap::decode(0x1234), None, "not ours");
        let bad = |len, with| {
            Trap {
                mode: Mode::Values,
                len,
                with,
                tag: 0,
            }
            .encode()
        };
        assert_eq!(bad(3, None), None);
        assert_eq!(bad(8, Some((1 << 47, 8))), None);
        assert_eq!(bad(8, Some((0x1000, 16))), None);
    }

    #[test]
    fn distinct_values_land_in_many_bytes() {
        let t = Trap {
            mode: Mode::Values,
            len: 8,
            with: None,
            tag: 1,
        };
        let mut seen = [false; 512];
        for v in 0..128u64 {
            seen[t.byte(v, 0, 512) as usize] = true;
        }
        // 128 values into 512 bytes: few collisions (expected about 14).
        assert!(seen.iter().filter(|s| **s).count() > 100);
        // The other variable's value changes the byte: (x, y) is a key.
        let moved = (0..64u64)
            .filter(|&y| t.byte(5, y, 512) != t.byte(5, 0, 512))
            .count();
        assert!(moved > 55, "{moved}");
        // Another watch's tag too.
        let other = Trap { tag: 2, ..t };
        assert!(
            (0..64u64)
                .filter(|&v| other.byte(v, 0, 512) != t.byte(v, 0, 512))
                .count()
                > 55
        );
    }

    #[test]
    fn max_buckets_climb_and_stay_few() {
        let mut last = 0;
        for v in 1..100_000u64 {
            let b = max_bucket(v);
            assert!(b >= last && b - last <= 1, "{v}: {last} -> {b}");
            last = b;
        }
        assert_eq!(max_bucket(u64::MAX), 16 + 59 * 4 + 3);
        // Values within one bucket count in one byte; a higher bucket
        // in the next.
        let t = Trap {
            mode: Mode::Max,
            len: 4,
            with: None,
            tag: 0,
        };
        assert_eq!(t.byte(1000, 0, 512), t.byte(1001, 0, 512));
        assert_eq!(t.byte(2048, 0, 512), (t.byte(1024, 0, 512) + 4) % 512);
        // A store marks every bucket up to its own: a higher value marks a
        // byte no lower one did, a lower one none that a higher one did not.
        let marked = |v: u64| t.bytes(v, 0, 512).collect::<Vec<u32>>();
        assert_eq!(marked(0), [t.byte(0, 0, 512)]);
        assert_eq!(marked(5).len(), 6);
        assert_eq!(marked(5).last(), Some(&t.byte(5, 0, 512)));
        assert!(marked(3).iter().all(|b| marked(20).contains(b)));
        assert!(!marked(3).contains(&t.byte(20, 0, 512)));
        assert!(marked(u64::MAX).len() <= 512);
        // Values mode: one byte.
        let v = Trap {
            mode: Mode::Values,
            ..t
        };
        assert_eq!(
            v.bytes(7, 3, 512).collect::<Vec<u32>>(),
            [v.byte(7, 3, 512)]
        );
    }

    #[test]
    fn values_are_read_little_endian_at_their_length() {
        let x: u64 = 0x1122_3344_5566_7788;
        let a = &x as *const u64 as u64;
        // SAFETY: `x` is 8 readable bytes.
        unsafe {
            assert_eq!(read_value(a, 1), 0x88);
            assert_eq!(read_value(a, 2), 0x7788);
            assert_eq!(read_value(a, 4), 0x5566_7788);
            assert_eq!(read_value(a, 8), x);
        }
    }
}
