//! The one mapping from domain errors to gRPC statuses.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::{Holder, WpdError};

/// Domain: the `ErrorInfo.domain` of every error detail.
pub const DOMAIN: &str = wpd_proto::reason::DOMAIN;

/// Maps an error to its status: code, message, and an `ErrorInfo` detail
/// with a machine-matchable reason.
pub fn to_status(e: &WpdError) -> Status {
    let (code, reason) = code_of(e);
    let mut meta = meta_of(e);
    // Bounded: the status travels in HTTP/2 trailers, and a client refuses
    // header lists over 16 KiB (tonic's default) as a broken connection,
    // whatever quotes a long input or names thousands of threads.
    for v in meta.values_mut() {
        bound(v, MAX_META);
    }
    let details = ErrorDetails::with_error_info(reason, DOMAIN, meta);
    // A status always says something: an error built from an empty text
    // still names its reason.
    let mut message = e.to_string();
    if message.trim().is_empty() {
        message = format!("{reason} (no detail given)");
    }
    bound(&mut message, MAX_MESSAGE);
    Status::with_error_details(code, message, details)
}

type Meta = std::collections::HashMap<String, String>;

/// The `ErrorInfo` metadata of an error: the figures a client acts on.
fn meta_of(e: &WpdError) -> Meta {
    let pairs: Vec<(&str, String)> = match e {
        WpdError::OutOfSlots {
            pid,
            needed,
            conflicts,
        } => {
            let tids: Vec<String> = conflicts.iter().map(|c| c.tid.to_string()).collect();
            let foreign = conflicts
                .iter()
                .filter(|c| c.holders.contains(&Holder::Foreign))
                .count();
            vec![
                ("pid", pid.to_string()),
                ("slots_needed", needed.to_string()),
                ("tids", tids.join(",")),
                ("threads_with_foreign_slots", foreign.to_string()),
            ]
        }
        WpdError::KernelMemory {
            needed,
            held,
            limit,
        } => vec![
            ("needed_bytes", needed.to_string()),
            ("held_bytes", held.to_string()),
            ("limit_bytes", limit.to_string()),
        ],
        WpdError::FdLimit {
            needed,
            open,
            limit,
            headroom,
            by_kernel,
            ..
        } => vec![
            ("needed_fds", needed.to_string()),
            ("open_fds", open.to_string()),
            ("rlimit_nofile", limit.to_string()),
            ("fd_headroom", headroom.to_string()),
            (
                "refused_by",
                if *by_kernel { "kernel" } else { "wpd" }.to_string(),
            ),
        ],
        WpdError::Symbol(s) => symbol_meta(s),
        _ => Vec::new(),
    };
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The metadata of a symbol error: the names a client may offer instead.
fn symbol_meta(s: &crate::symbols::SymbolError) -> Vec<(&'static str, String)> {
    use crate::symbols::SymbolError as S;
    match s {
        S::Unknown { closest, .. }
        | S::UnknownFunction { closest, .. }
        | S::UnknownType { closest, .. }
        | S::SourceNotLoaded { closest, .. } => vec![("closest", closest.join(","))],
        S::Ambiguous { modules, .. } => vec![("modules", modules.join(","))],
        S::NoSuchModule { loaded, .. } | S::ModuleNotLoaded { loaded, .. } => {
            vec![("loaded", loaded.join(","))]
        }
        S::TooLarge { needed, .. } => vec![("slots_needed", needed.to_string())],
        S::ModuleLoading { module, .. } => vec![("module", module.clone())],
        S::TooManyLoads {
            module, uid, max, ..
        } => vec![
            ("module", module.clone()),
            ("uid", uid.to_string()),
            ("max_loads", max.to_string()),
        ],
        _ => Vec::new(),
    }
}

/// Most bytes of a status message (its `grpc-message` trailer may take up
/// to three times as many, percent-encoded).
pub const MAX_MESSAGE: usize = 2048;
/// Most bytes of one metadata value of a status's `ErrorInfo`.
pub const MAX_META: usize = 512;

/// Cuts `s` to at most `max` bytes (at a character boundary), saying how
/// much was left out.
fn bound(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let total = s.len();
    let mut end = max.saturating_sub(40);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(&format!("… ({} more bytes)", total - end));
}

impl From<WpdError> for Status {
    fn from(e: WpdError) -> Status {
        to_status(&e)
    }
}

/// Code and reason for each error; exhaustive on purpose.
pub fn code_of(e: &WpdError) -> (Code, &'static str) {
    use wpd_proto::reason as r;
    match e {
        WpdError::Spec(_) => (Code::InvalidArgument, r::BAD_SPEC),
        WpdError::InvalidArgument(_) => (Code::InvalidArgument, r::INVALID_ARGUMENT),
        WpdError::NoSuchProcess(_) => (Code::NotFound, r::NO_SUCH_PROCESS),
        WpdError::NotAttached(_) => (Code::NotFound, r::NOT_ATTACHED),
        WpdError::NoSuchThread { .. } => (Code::NotFound, r::NO_SUCH_THREAD),
        WpdError::NotHeld { .. } => (Code::FailedPrecondition, r::THREAD_NOT_HELD),
        WpdError::CannotStep { .. } => (Code::FailedPrecondition, r::CANNOT_STEP),
        WpdError::NoSuchWatchpoint(_) => (Code::NotFound, r::NO_SUCH_WATCHPOINT),
        WpdError::OutOfSlots { .. } => (Code::ResourceExhausted, r::OUT_OF_SLOTS),
        WpdError::PermissionDenied { .. } => (Code::PermissionDenied, r::PERMISSION_DENIED),
        WpdError::Unauthenticated(_) => (Code::Unauthenticated, r::UNAUTHENTICATED),
        WpdError::Degraded(_) => (Code::Unavailable, r::DEGRADED),
        WpdError::BackendUnavailable { .. } => (Code::FailedPrecondition, r::BACKEND_UNAVAILABLE),
        WpdError::BackendMismatch { .. } => (Code::FailedPrecondition, r::BACKEND_MISMATCH),
        WpdError::NeedsBackend { .. } => (Code::InvalidArgument, r::NEEDS_BACKEND),
        WpdError::NotAProcess { .. } => (Code::InvalidArgument, r::NOT_A_PROCESS),
        WpdError::OwnProcess(_) => (Code::InvalidArgument, r::OWN_PROCESS),
        WpdError::InitProcess => (Code::FailedPrecondition, r::INIT_PROCESS),
        WpdError::OtherPidNamespace { .. } => (Code::FailedPrecondition, r::OTHER_PID_NAMESPACE),
        WpdError::NotInPidNamespace { .. } => (Code::NotFound, r::NOT_IN_PID_NAMESPACE),
        WpdError::NoJournal => (Code::FailedPrecondition, r::NO_JOURNAL),
        WpdError::NotSaved { .. } => (Code::Unavailable, r::NOT_SAVED),
        WpdError::ProcessExited(_) => (Code::NotFound, r::PROCESS_EXITED),
        WpdError::ProcessLost { .. } => (Code::FailedPrecondition, r::PROCESS_LOST),
        WpdError::NoLoaderHook { .. } => (Code::FailedPrecondition, r::NO_LOADER_HOOK),
        WpdError::AlreadyTraced { .. } => (Code::FailedPrecondition, r::ALREADY_TRACED),
        WpdError::LimitReached { .. } => (Code::ResourceExhausted, r::LIMIT_REACHED),
        WpdError::KernelMemory { .. } => (Code::ResourceExhausted, r::LIMIT_REACHED),
        WpdError::FdLimit { .. } => (Code::ResourceExhausted, r::FD_LIMIT),
        WpdError::Kernel { .. } => (Code::Internal, r::KERNEL_ERROR),
        WpdError::LeaseEnded { .. } => (Code::Aborted, r::LEASE_ENDED),
        WpdError::Internal(_) => (Code::Internal, r::INTERNAL),
        WpdError::SignalUnusable(_) => (Code::FailedPrecondition, r::SIGNAL_UNUSABLE),
        WpdError::NoFeedbackPath(_) => (Code::FailedPrecondition, r::NO_FEEDBACK_PATH),
        WpdError::Symbol(s) => symbol_code_of(s),
    }
}

/// Code and reason for each symbol error; exhaustive on purpose.
fn symbol_code_of(s: &crate::symbols::SymbolError) -> (Code, &'static str) {
    use crate::symbols::SymbolError as S;
    use wpd_proto::reason as r;
    match s {
        S::Syntax(_) => (Code::InvalidArgument, r::BAD_SYMBOL),
        S::NoSuchModule { .. } => (Code::NotFound, r::NO_SUCH_MODULE),
        S::ModuleNotLoaded { .. } => (Code::NotFound, r::MODULE_NOT_LOADED),
        S::Unknown { .. } | S::UnknownFunction { .. } => (Code::NotFound, r::UNKNOWN_SYMBOL),
        S::UnknownType { .. } => (Code::NotFound, r::UNKNOWN_TYPE),
        S::OptimizedOut { .. } => (Code::NotFound, r::OPTIMIZED_OUT),
        S::NotAnObject { .. } => (Code::InvalidArgument, r::NOT_AN_OBJECT),
        S::Ambiguous { .. } => (Code::InvalidArgument, r::AMBIGUOUS_SYMBOL),
        S::NotAVariable { .. } => (Code::InvalidArgument, r::NOT_A_VARIABLE),
        S::ThreadLocal { .. } => (Code::InvalidArgument, r::THREAD_LOCAL),
        S::NoDebugInfo { .. } => (Code::FailedPrecondition, r::NO_DEBUG_INFO),
        S::Path { .. } | S::Offset { .. } | S::NoSize { .. } => {
            (Code::InvalidArgument, r::BAD_SYMBOL_PATH)
        }
        S::TooLarge { .. } => (Code::InvalidArgument, r::OBJECT_TOO_LARGE),
        S::Unreadable { .. } => (Code::FailedPrecondition, r::SYMBOLS_UNREADABLE),
        S::NoCodeAtLine { .. } => (Code::NotFound, r::NO_CODE_AT_LINE),
        S::SourceNotLoaded { .. } => (Code::NotFound, r::SOURCE_NOT_LOADED),
        S::ModuleLoading { .. } => (Code::Unavailable, r::MODULE_LOADING),
        S::TooManyLoads { .. } => (Code::ResourceExhausted, r::TOO_MANY_LOADS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::SpecError;
    use crate::error::SlotConflict;
    use crate::model::{BackendKind, WatchId};

    /// A message quoting a long input, and metadata naming thousands of
    /// threads, are bounded (the whole status stays far below a client's
    /// 16 KiB of headers), saying how much was left out; short ones are
    /// untouched.
    #[test]
    fn long_texts_are_bounded() {
        let long = "é".repeat(3000);
        let st = to_status(&WpdError::InvalidArgument(format!(
            "unknown function {long}"
        )));
        assert!(st.message().len() <= MAX_MESSAGE, "{}", st.message().len());
        assert!(st.message().ends_with("more bytes)"), "{}", st.message());
        let conflicts: Vec<SlotConflict> = (1..=5000)
            .map(|tid| SlotConflict {
                tid: 100_000 + tid,
                holders: vec![Holder::Foreign; 4],
            })
            .collect();
        let st = to_status(&WpdError::OutOfSlots {
            pid: 1,
            needed: 1,
            conflicts,
        });
        assert!(st.message().len() <= MAX_MESSAGE);
        let info = st.get_details_error_info().unwrap();
        assert!(info.metadata["tids"].len() <= MAX_META);
        assert!(st.details().len() < 8 * 1024, "{}", st.details().len());
        let st = to_status(&WpdError::InvalidArgument("short".into()));
        assert_eq!(st.message(), "short");
    }
    use wpd_proto::reason as r;

    fn check(e: WpdError, code: Code, reason: &str, msg: &str) {
        let s = to_status(&e);
        assert_eq!(s.code(), code, "{e:?}");
        assert!(s.message().contains(msg), "{:?} lacks {msg:?}", s.message());
        assert_eq!(s.get_details_error_info().unwrap().reason, reason);
    }

    #[test]
    fn every_error_maps() {
        check(
            WpdError::Spec(SpecError::Empty),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "length 0",
        );
        check(
            WpdError::Spec(SpecError::TooLarge {
                addr: 0x1000,
                len: 40,
                needed: 5,
                slots: 4,
                lengths: "1, 2, 4 or 8",
            }),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "40 bytes at 0x1000 need 5 debug-register slots per thread",
        );
        check(
            WpdError::Spec(SpecError::NoReadOnly(crate::arch::current::ARCH)),
            Code::InvalidArgument,
            r::BAD_SPEC,
            "reads only",
        );
        check(
            WpdError::InvalidArgument("x".into()),
            Code::InvalidArgument,
            r::INVALID_ARGUMENT,
            "x",
        );
        check(
            WpdError::NoSuchProcess(5),
            Code::NotFound,
            r::NO_SUCH_PROCESS,
            "pid 5",
        );
        check(
            WpdError::NotAttached(5),
            Code::NotFound,
            r::NOT_ATTACHED,
            "not attached",
        );
        check(
            WpdError::NotHeld { pid: 1, tid: 2 },
            Code::FailedPrecondition,
            r::THREAD_NOT_HELD,
            "thread 2 of process 1 is running",
        );
        check(
            WpdError::CannotStep {
                pid: 1,
                tid: 2,
                why: "this is the outermost frame".into(),
            },
            Code::FailedPrecondition,
            r::CANNOT_STEP,
            "thread 2 of process 1 cannot step there: this is the outermost frame",
        );
        check(
            WpdError::NoSuchThread { pid: 1, tid: 2 },
            Code::NotFound,
            r::NO_SUCH_THREAD,
            "thread 2 is not a thread of process 1",
        );
        check(
            WpdError::NoSuchWatchpoint(WatchId(9)),
            Code::NotFound,
            r::NO_SUCH_WATCHPOINT,
            "no watchpoint #9",
        );
        check(
            WpdError::OutOfSlots {
                pid: 1,
                needed: 1,
                conflicts: vec![SlotConflict {
                    tid: 7,
                    holders: vec![Holder::Ours(WatchId(3)), Holder::Foreign],
                }],
            },
            Code::ResourceExhausted,
            r::OUT_OF_SLOTS,
            "tid 7 [watchpoints #3, 1 held by another owner",
        );
        check(
            WpdError::PermissionDenied {
                pid: 1,
                detail: "no".into(),
            },
            Code::PermissionDenied,
            r::PERMISSION_DENIED,
            "no",
        );
        check(
            WpdError::BackendUnavailable {
                backend: BackendKind::Ptrace,
                reason: "r".into(),
            },
            Code::FailedPrecondition,
            r::BACKEND_UNAVAILABLE,
            "ptrace",
        );
        check(
            WpdError::BackendMismatch {
                pid: 1,
                attached: BackendKind::Perf,
                asked: BackendKind::Ptrace,
            },
            Code::FailedPrecondition,
            r::BACKEND_MISMATCH,
            "detach first",
        );
        check(
            WpdError::FdLimit {
                what: "attach",
                detail: "10001 threads × 2 CPUs".into(),
                needed: 20_002,
                open: 30,
                limit: 20_000,
                headroom: 640,
                by_kernel: false,
            },
            Code::ResourceExhausted,
            r::FD_LIMIT,
            "attach needs 20002 more (10001 threads × 2 CPUs); wpd has 30 fds open, keeps 640 free for connections, and RLIMIT_NOFILE is 20000",
        );
        check(
            WpdError::ProcessExited(3),
            Code::NotFound,
            r::PROCESS_EXITED,
            "exited",
        );
        check(
            WpdError::AlreadyTraced {
                pid: 1,
                tid: 2,
                tracer: 3,
                tracer_tid: 4,
                comm: "gdb".into(),
            },
            Code::FailedPrecondition,
            r::ALREADY_TRACED,
            "already traced by process 3 (gdb, thread 4)",
        );
        check(
            WpdError::Unauthenticated("invalid token".into()),
            Code::Unauthenticated,
            r::UNAUTHENTICATED,
            "invalid token",
        );
        check(
            WpdError::NeedsBackend {
                feature: "stopping on a hit",
                needs: Some(BackendKind::Ptrace),
                hint: "; the perf backend never stops the target",
            },
            Code::InvalidArgument,
            r::NEEDS_BACKEND,
            "stopping on a hit needs the ptrace backend",
        );
        check(
            WpdError::NotAProcess { tid: 8, pid: 7 },
            Code::InvalidArgument,
            r::NOT_A_PROCESS,
            "use --pid 7 --tid 8",
        );
        check(
            WpdError::OwnProcess(9),
            Code::InvalidArgument,
            r::OWN_PROCESS,
            "the daemon itself",
        );
        check(
            WpdError::InitProcess,
            Code::FailedPrecondition,
            r::INIT_PROCESS,
            "--allow-init",
        );
        check(
            WpdError::OtherPidNamespace {
                pid: 5,
                why: "it sees the daemon's namespace from above",
            },
            Code::FailedPrecondition,
            r::OTHER_PID_NAMESPACE,
            "another pid namespace",
        );
        check(
            WpdError::NotInPidNamespace { pid: 5 },
            Code::NotFound,
            r::NOT_IN_PID_NAMESPACE,
            "no process has pid 5 in the caller's pid namespace",
        );
        check(
            WpdError::NoJournal,
            Code::FailedPrecondition,
            r::NO_JOURNAL,
            "--state-dir",
        );
        check(
            WpdError::NotSaved {
                what: "watchpoint 7".into(),
                error: "No space left on device (os error 28)".into(),
                outcome: "it was removed again",
            },
            Code::Unavailable,
            "NOT_SAVED",
            "watchpoint 7 could not be saved in the state directory (No space left on device \
             (os error 28)): it was removed again",
        );
        check(
            WpdError::NoLoaderHook {
                pid: 5,
                detail: "no symbol named it in the 2 modules it maps".into(),
            },
            Code::FailedPrecondition,
            r::NO_LOADER_HOOK,
            "a pending code event waits for the dynamic linker to load its module, and process 5 \
             has no dynamic linker's debugger hook (_dl_debug_state: no symbol named it in the 2 \
             modules it maps)",
        );
        check(
            WpdError::ProcessLost {
                pid: 5,
                why: "it executed a setuid program".into(),
            },
            Code::FailedPrecondition,
            r::PROCESS_LOST,
            "process 5 can no longer be watched: it executed a setuid program",
        );
        check(
            WpdError::kernel("open", nix::errno::Errno::EIO),
            Code::Internal,
            r::KERNEL_ERROR,
            "open failed",
        );
    }

    #[test]
    fn a_module_loading_is_retried_later_and_too_many_loads_exhausted() {
        use crate::symbols::SymbolError as S;
        let e = WpdError::Symbol(S::ModuleLoading {
            pid: 7,
            module: "/home/u/dl".into(),
            since_ms: 5000,
        });
        assert_eq!(
            to_status(&e).get_details_error_info().unwrap().metadata["module"],
            "/home/u/dl"
        );
        check(
            e,
            Code::Unavailable,
            r::MODULE_LOADING,
            "module /home/u/dl of process 7 is still loading (for 5000 ms",
        );
        let e = WpdError::Symbol(S::TooManyLoads {
            pid: 7,
            module: "/home/u/dl".into(),
            uid: 1001,
            in_flight: 4,
            max: 4,
        });
        assert_eq!(
            to_status(&e).get_details_error_info().unwrap().metadata["uid"],
            "1001"
        );
        check(
            e,
            Code::ResourceExhausted,
            r::TOO_MANY_LOADS,
            "4 module files of processes of uid 1001 are loading already (at most 4 at once)",
        );
    }

    #[test]
    fn what_pending_would_wait_for_names_the_flag() {
        use crate::symbols::SymbolError as S;
        let unknown = || {
            WpdError::Symbol(S::UnknownFunction {
                pid: 7,
                name: "plugin_work".into(),
                searched: 3,
                closest: vec!["plugin_new".into()],
                stripped: vec![],
            })
        };
        check(
            unknown(),
            Code::NotFound,
            r::UNKNOWN_SYMBOL,
            "no function named \"plugin_work\" in the 3 modules process 7 has loaded (closest: plugin_new)",
        );
        check(
            unknown(),
            Code::NotFound,
            r::UNKNOWN_SYMBOL,
            "--pending LIBRARY:plugin_work",
        );
        let e = WpdError::Symbol(S::SourceNotLoaded {
            pid: 7,
            file: "plugin.c".into(),
            line: 14,
            searched: 2,
            closest: vec!["/src/plugins.c".into()],
        });
        let s = to_status(&e);
        assert_eq!(
            s.get_details_error_info().unwrap().metadata["closest"],
            "/src/plugins.c"
        );
        check(
            e,
            Code::NotFound,
            r::SOURCE_NOT_LOADED,
            "no code at plugin.c:14 in process 7: no line table names that file (2 modules \
             with line tables loaded; closest: /src/plugins.c); if it is a source of a library \
             the process loads later, set the breakpoint pending (wpctl --pending",
        );
        let none = WpdError::Symbol(S::SourceNotLoaded {
            pid: 7,
            file: "plugin.c".into(),
            line: 14,
            searched: 0,
            closest: vec![],
        });
        check(
            none,
            Code::NotFound,
            r::SOURCE_NOT_LOADED,
            "has DWARF line tables (build with -g); if it",
        );
    }

    #[test]
    fn empty_texts_still_give_a_message() {
        let s = to_status(&WpdError::InvalidArgument(String::new()));
        assert_eq!(s.message(), "INVALID_ARGUMENT (no detail given)");
    }

    #[test]
    fn limits_map_to_resource_exhausted() {
        check(
            WpdError::LimitReached {
                what: "watchpoints per caller",
                limit: 8,
                hint: "remove some",
            },
            Code::ResourceExhausted,
            r::LIMIT_REACHED,
            "watchpoints per caller (limit 8)",
        );
        check(
            WpdError::LeaseEnded {
                lease: 9,
                during: "during the pause",
                undone: "the threads run again",
            },
            Code::Aborted,
            r::LEASE_ENDED,
            "lease 9 ended during the pause: the threads run again",
        );
        check(
            WpdError::Internal("request task failed: cancelled".into()),
            Code::Internal,
            r::INTERNAL,
            "request task failed",
        );
    }

    #[test]
    fn out_of_slots_names_tids_in_metadata() {
        let s = to_status(&WpdError::OutOfSlots {
            pid: 4,
            needed: 3,
            conflicts: vec![
                SlotConflict {
                    tid: 4,
                    holders: vec![],
                },
                SlotConflict {
                    tid: 5,
                    holders: vec![],
                },
            ],
        });
        let info = s.get_details_error_info().unwrap();
        assert_eq!(info.metadata["tids"], "4,5");
        assert_eq!(info.metadata["slots_needed"], "3");
        assert!(
            s.message()
                .contains("takes 3 slots on every thread and 2 threads have fewer free"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn a_watchpoint_of_several_slots_is_named_once_with_its_count() {
        let s = to_status(&WpdError::OutOfSlots {
            pid: 4,
            needed: 2,
            conflicts: vec![SlotConflict {
                tid: 9,
                holders: vec![
                    Holder::Ours(WatchId(3)),
                    Holder::Ours(WatchId(3)),
                    Holder::Ours(WatchId(3)),
                    Holder::Foreign,
                ],
            }],
        });
        assert!(
            s.message()
                .contains("tid 9 [watchpoints #3 (3 slots), 1 held by another owner"),
            "{}",
            s.message()
        );
    }
}
