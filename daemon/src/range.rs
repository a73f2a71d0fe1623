//! What a watchpoint covers: the access kind, the lengths the hardware
//! watches, and a range with the aligned pieces (one slot each) that cover
//! it. The plain data every layer names, below the spec that holds them
//! (`model.rs`) and the filter and values that read them.

use std::fmt;

/// What kind of access fires a watchpoint. (Read-only does not exist on
/// x86-64; the RPC layer refuses it with an explanation.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Stores.
    Write,
    /// Loads or stores.
    ReadWrite,
    /// Instruction fetch.
    Exec,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Write => "write",
            Access::ReadWrite => "rw",
            Access::Exec => "exec",
        })
    }
}

/// A watch length the hardware supports (1, 2, 4 or 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchLen(u8);

impl WatchLen {
    /// `Some` for 1, 2, 4 and 8.
    pub fn new(bytes: u32) -> Option<Self> {
        matches!(bytes, 1 | 2 | 4 | 8).then_some(WatchLen(bytes as u8))
    }
    /// Length in bytes.
    pub fn bytes(self) -> u32 {
        u32::from(self.0)
    }
}

/// One aligned part of a watched range: what one debug-register slot
/// watches (`addr` is a multiple of `len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Piece {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: WatchLen,
}

/// A watched range `[addr, addr + len)` and the aligned pieces that cover it
/// exactly, lowest first (one slot per piece on every thread; at most
/// `arch::current::SLOTS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// The pieces, in address order.
    pub pieces: Vec<Piece>,
}

impl Range {
    /// Slots it takes on each thread.
    pub fn slots(&self) -> usize {
        self.pieces.len()
    }

    /// Piece `i` (panics when out of range: pieces come from the ledger,
    /// which only holds indices of this watchpoint's pieces).
    pub fn piece(&self, i: u8) -> Piece {
        self.pieces[usize::from(i)]
    }
}
