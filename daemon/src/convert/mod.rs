//! Wire ⇄ domain conversions. Validation happens here, once: a domain value
//! that exists is valid.
//!
//! Rooms: `watch.rs` (a watchpoint's spec and what is said of it),
//! `code.rs` (code events and breakpoints), `policy.rs` (policies and their
//! selectors), `process.rs` (processes, threads, the symbol at an address).
//! This file holds the request fields every room checks alike.

mod code;
mod policy;
mod process;
mod watch;

use wpd_proto::v1 as pb;

use crate::arch;
use crate::error::WpdError;
use crate::model::{BackendKind, Pid, Tid};

pub use crate::wire::event::{
    access_to_pb, backend_to_pb, event_to_pb, frame_to_pb, hit_value_name, locate_hit,
    owner_from_pb, owner_to_pb, place_to_pb, symbol_to_pb, value_kind_of, value_type_to_pb,
};
pub use code::{code_from_pb, code_to_pb, object_counts_to_pb, object_view_to_pb, watch_request};
pub use policy::{policy_spec_from_pb, selector_from_pb, selector_to_pb};
pub use process::address_to_pb;
pub use watch::{asked_from_pb, reading_to_pb, spec_to_pb};

/// A pid from the wire: must be positive.
pub fn pid(p: i32) -> Result<Pid, WpdError> {
    if p <= 0 {
        return Err(WpdError::InvalidArgument(format!(
            "pid must be a positive process id, got {p}"
        )));
    }
    Ok(p)
}

/// Thread ids from the wire: each positive; sorted, each once (a request
/// that names a thread 100,000 times costs what naming it once does).
pub fn tids(t: &[i32]) -> Result<Vec<Tid>, WpdError> {
    if let Some(bad) = t.iter().find(|&&t| t <= 0) {
        return Err(WpdError::InvalidArgument(format!(
            "tid must be positive, got {bad}"
        )));
    }
    let mut t = t.to_vec();
    t.sort_unstable();
    t.dedup();
    Ok(t)
}

/// Most frames GetThreadStack walks.
pub const MAX_STACK_DEPTH: u32 = 128;

/// Most bytes one ReadMemory returns.
pub const MAX_READ: u32 = 1 << 20;

/// GetThreadStack's depth: 0 means 32.
pub fn stack_depth(d: u32) -> Result<usize, WpdError> {
    match d {
        0 => Ok(32),
        d if d > MAX_STACK_DEPTH => Err(WpdError::InvalidArgument(format!(
            "depth {d} is more than {MAX_STACK_DEPTH} frames"
        ))),
        d => Ok(d as usize),
    }
}

/// ReadMemory's length: 1 to [`MAX_READ`] bytes, inside user space.
pub fn read_length(addr: u64, len: u32) -> Result<usize, WpdError> {
    if len == 0 || len > MAX_READ {
        return Err(WpdError::InvalidArgument(format!(
            "length must be 1 to {MAX_READ} bytes, got {len}"
        )));
    }
    if addr
        .checked_add(u64::from(len))
        .is_none_or(|end| end > arch::current::USER_ADDR_LIMIT)
    {
        return Err(WpdError::InvalidArgument(format!(
            "{len} bytes at {addr:#x} reach past the end of user space ({:#x})",
            arch::current::USER_ADDR_LIMIT
        )));
    }
    Ok(len as usize)
}

/// A backend from the wire (`None` = daemon default).
pub fn backend(b: i32) -> Result<Option<BackendKind>, WpdError> {
    match pb::Backend::try_from(b) {
        Ok(pb::Backend::Unspecified) => Ok(None),
        Ok(pb::Backend::Perf) => Ok(Some(BackendKind::Perf)),
        Ok(pb::Backend::Ptrace) => Ok(Some(BackendKind::Ptrace)),
        Err(_) => Err(WpdError::InvalidArgument(format!(
            "unknown backend value {b}"
        ))),
    }
}
