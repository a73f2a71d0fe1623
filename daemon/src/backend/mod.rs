//! Backends that program debug registers. Only the perf backend exists so
//! far; `BackendKind::Ptrace` is refused with `BackendUnavailable`.

pub mod perf;
pub mod ptrace;

use crate::model::BackendKind;

/// Whether a backend can be used on this host, and why not.
#[derive(Debug, Clone)]
pub struct Availability {
    /// The backend.
    pub kind: BackendKind,
    /// Usable here.
    pub usable: bool,
    /// Why not (empty when usable).
    pub reason: String,
}
