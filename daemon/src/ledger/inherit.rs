//! Inheritance of a process-wide perf breakpoint by threads created while
//! it was being armed on their creator: classified from timestamps where
//! they tell ([`classify`]), else left uncertain for the kernel to decide.

/// How a new thread relates to one of its creator's inheritable watchpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inheritance {
    /// Certainly copied by the kernel.
    Inherited,
    /// Certainly not copied: it must be armed explicitly.
    Missing,
    /// Cannot tell from the timestamps: ask the kernel.
    Unknown,
}

/// How long after a breakpoint's perf_event_open returned a new thread's
/// FORK record may still belong to a clone that had already passed the
/// inheritance step (the tail of `copy_process`). Inside the window the
/// daemon asks the kernel instead of guessing.
pub const INHERIT_MARGIN_NS: u64 = 20_000_000;

/// Classifies a fork at `time` against a breakpoint opened on the creator
/// during `[absent_before, certain_from - margin]`.
pub fn classify(time: u64, absent_before: u64, certain_from: u64) -> Inheritance {
    if time < absent_before {
        Inheritance::Missing
    } else if time >= certain_from {
        Inheritance::Inherited
    } else {
        Inheritance::Unknown
    }
}
