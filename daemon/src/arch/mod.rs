//! Architecture layer: what the debug-register hardware can watch.
//!
//! Architecture Invariant: no debug-register literal (DR7 bits, slot count,
//! address limits) appears outside this module. A second architecture is a
//! second file here, selected by `cfg`, exposing the same items.

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64 as current;

use crate::model::{Access, Range};

/// Why a watch request is impossible on this architecture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// nothing to watch
    #[error("length 0: a watchpoint covers at least 1 byte")]
    Empty,
    /// the range needs more slots than a thread has
    #[error(
        "{len} bytes at {addr:#x} need {needed} debug-register slots per thread (aligned pieces of {lengths} bytes) and a thread has {slots}: watch part of it (a member, or fewer bytes with --len)"
    )]
    TooLarge {
        /// Requested address.
        addr: u64,
        /// Requested length.
        len: u32,
        /// Slots the range would take.
        needed: usize,
        /// Slots per thread.
        slots: usize,
        /// The piece lengths, for the message ("1, 2, 4 or 8").
        lengths: &'static str,
    },
    /// exec watchpoints must have length 1
    #[error("an exec watchpoint must have length 1 (got {0})")]
    ExecLength(u32),
    /// kernel or non-canonical address
    #[error("address {addr:#x} is not a user-space address: {why}")]
    NotUserAddress {
        /// Requested address.
        addr: u64,
        /// Which limit it broke.
        why: &'static str,
    },
    /// read-only watchpoints do not exist on this architecture
    #[error(
        "{0} debug registers cannot watch reads only: use access rw (read or write) and filter, or write"
    )]
    NoReadOnly(&'static str),
    /// access kind not given
    #[error("access kind is required: write, rw or exec")]
    NoAccess,
}

/// The access that watches reads only, or why the architecture has none
/// (a request for reads only is refused with it, never widened silently).
pub fn read_only() -> Result<Access, SpecError> {
    current::read_only()
}

/// Checks a (address, length, access) triple against the architecture and
/// splits the range into the aligned pieces the slots watch.
pub fn validate(addr: u64, len: u32, access: Access) -> Result<Range, SpecError> {
    current::validate(addr, len, access)
}
