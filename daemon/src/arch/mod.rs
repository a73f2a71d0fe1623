//! Architecture layer: what the debug-register hardware can watch.
//!
//! Architecture Invariant: no debug-register literal (DR7 bits, slot count,
//! address limits) appears outside this module. A second architecture is a
//! second file here, selected by `cfg`, exposing the same items.

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
#[cfg(target_arch = "x86_64")]
pub use x86_64 as current;

use crate::model::{Access, WatchLen};

/// Why a watch request is impossible on this architecture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// length {0} is not supported: use 1, 2, 4 or 8 bytes
    #[error("length {0} is not supported: use 1, 2, 4 or 8 bytes")]
    BadLength(u32),
    /// misaligned address for the length
    #[error(
        "address {addr:#x} is not aligned to its length {len}: a watchpoint of {len} bytes needs an address that is a multiple of {len}"
    )]
    Misaligned {
        /// Requested address.
        addr: u64,
        /// Requested length.
        len: u32,
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

/// Checks a (address, length, access) triple against the architecture.
pub fn validate(addr: u64, len: u32, access: Access) -> Result<WatchLen, SpecError> {
    current::validate(addr, len, access)
}
