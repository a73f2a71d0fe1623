//! The `wpd.v1` gRPC API: generated prost messages and tonic client/server.
//!
//! The `.proto` files live in `proto/wpd/v1/`; `build.rs` compiles them with
//! protox, so building needs nothing but cargo.

/// Package `wpd.v1`.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("wpd.v1");
    // The server, apart: its `StreamEvents` sends `StreamEventsItem`s.
    include!(concat!(env!("OUT_DIR"), "/server/wpd.v1.rs"));
    pub use crate::stream::StreamEventsItem;

    /// Encoded `FileDescriptorSet` of the API, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("wpd_v1_descriptor");
}

/// Default Unix socket path of the system's daemon (run as root; `wpd` and
/// `wpctl`).
pub const DEFAULT_SOCKET: &str = "/run/wpd/wpd.sock";

/// The Unix socket of a daemon run by user `uid` (not root): `wpd/wpd.sock`
/// in the user's runtime directory (`$XDG_RUNTIME_DIR`, which the login
/// manager makes private to the user), else in `/tmp/wpd-UID`, a directory
/// the daemon makes private to the user (and refuses when someone else
/// made it).
pub fn user_socket(uid: u32, runtime_dir: Option<&std::path::Path>) -> std::path::PathBuf {
    match runtime_dir.filter(|d| d.is_absolute()) {
        Some(d) => d.join("wpd").join("wpd.sock"),
        None => std::path::PathBuf::from(format!("/tmp/wpd-{uid}/wpd.sock")),
    }
}

/// The socket a daemon of effective uid `euid` listens on unless told
/// otherwise: the system's for root, else the user's own
/// ([`user_socket`]).
pub fn default_socket(euid: u32, runtime_dir: Option<&std::path::Path>) -> std::path::PathBuf {
    if euid == 0 {
        DEFAULT_SOCKET.into()
    } else {
        user_socket(euid, runtime_dir)
    }
}

/// Name of the service as registered for health checks and reflection.
pub const SERVICE_NAME: &str = "wpd.v1.Watchpoints";

/// Longest bearer token the daemon accepts, in bytes (`wpd` refuses to
/// start with a longer one, `wpctl` to send one).
pub const MAX_TOKEN_LEN: usize = 4096;

pub mod condition;
pub mod places;
mod stream;
pub mod text;
pub mod value;

/// The canonical upper-snake-case name of a gRPC status code (`NOT_FOUND`),
/// as the gRPC specification spells it: what `wpctl --json` reports and
/// the daemon's metrics label.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::code_name;
    use tonic::Code;

    #[test]
    fn codes_have_their_canonical_names() {
        assert_eq!(code_name(Code::Ok), "OK");
        assert_eq!(code_name(Code::NotFound), "NOT_FOUND");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
        // Every code 0..=16 by number, as `grpc-status` carries it.
        for n in 0..=16 {
            let name = code_name(Code::from(n));
            assert!(
                name.chars().all(|c| c.is_ascii_uppercase() || c == '_'),
                "{name}"
            );
            assert!(n == 2 || name != "UNKNOWN", "{n}");
        }
        assert_eq!(code_name(Code::from_bytes(b"16")), "UNAUTHENTICATED");
        assert_eq!(code_name(Code::from_bytes(b"99")), "UNKNOWN");
        assert_eq!(code_name(Code::from_bytes(b"x")), "UNKNOWN");
    }
}

/// The `reason` of the `google.rpc.ErrorInfo` detail every error status of
/// the daemon carries (domain [`reason::DOMAIN`]): what clients match on.
/// Every status the daemon's own code answers with has one (its one map
/// from errors to statuses builds them all, checked by its tidy test);
/// those gRPC makes itself have none (a request that does not decode, a
/// method or service the daemon lacks, the standard health service's
/// answers).
pub mod reason {
    /// `ErrorInfo.domain` of every error.
    pub const DOMAIN: &str = "wpd.v1";
    /// The watchpoint spec is impossible on this architecture (length,
    /// alignment, address, access kind).
    pub const BAD_SPEC: &str = "BAD_SPEC";
    /// A request field is missing or malformed.
    pub const INVALID_ARGUMENT: &str = "INVALID_ARGUMENT";
    /// No such process.
    pub const NO_SUCH_PROCESS: &str = "NO_SUCH_PROCESS";
    /// The process is not attached.
    pub const NOT_ATTACHED: &str = "NOT_ATTACHED";
    /// The thread is not one of the process.
    pub const NO_SUCH_THREAD: &str = "NO_SUCH_THREAD";
    /// The thread runs: what was asked needs it held stopped by wpd.
    pub const THREAD_NOT_HELD: &str = "THREAD_NOT_HELD";
    /// A step the thread cannot take where it is (`Step`).
    pub const CANNOT_STEP: &str = "CANNOT_STEP";
    /// Unknown watchpoint id.
    pub const NO_SUCH_WATCHPOINT: &str = "NO_SUCH_WATCHPOINT";
    /// Threads without a free debug-register slot (metadata `tids`).
    pub const OUT_OF_SLOTS: &str = "OUT_OF_SLOTS";
    /// The caller may not act on the process.
    pub const PERMISSION_DENIED: &str = "PERMISSION_DENIED";
    /// No caller identity or a bad token.
    pub const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    /// The backend asked for cannot work here.
    pub const BACKEND_UNAVAILABLE: &str = "BACKEND_UNAVAILABLE";
    /// The process is attached with another backend.
    pub const BACKEND_MISMATCH: &str = "BACKEND_MISMATCH";
    /// The feature needs another backend (stop on hit, only-on-change,
    /// resume: ptrace).
    pub const NEEDS_BACKEND: &str = "NEEDS_BACKEND";
    /// The pid names a thread, not a process.
    pub const NOT_A_PROCESS: &str = "NOT_A_PROCESS";
    /// The process is the daemon itself.
    pub const OWN_PROCESS: &str = "OWN_PROCESS";
    /// pid 1 without `allow_init`.
    pub const INIT_PROCESS: &str = "INIT_PROCESS";
    /// The caller runs in another pid namespace than the daemon's: the
    /// pids it names are not the daemon's, and are not read as such.
    pub const OTHER_PID_NAMESPACE: &str = "OTHER_PID_NAMESPACE";
    /// The caller runs in a pid namespace nested in the daemon's, which
    /// numbers no process by the pid it gave (or the process named, by a
    /// watchpoint's id, is outside that namespace).
    pub const NOT_IN_PID_NAMESPACE: &str = "NOT_IN_PID_NAMESPACE";
    /// A replay (`StreamEventsRequest.after_seq`/`since_time_ns`) from a
    /// daemon that keeps no journal.
    pub const NO_JOURNAL: &str = "NO_JOURNAL";
    /// What SetWatchpoint, SetPolicy or RemoveWatchpoint promised to keep
    /// across restarts could not be saved in the state directory (a full
    /// disk, an I/O error): the request changed nothing; try again once
    /// the disk has room.
    pub const NOT_SAVED: &str = "NOT_SAVED";
    /// The process exited during the request.
    pub const PROCESS_EXITED: &str = "PROCESS_EXITED";
    /// The process can no longer be watched (e.g. it executed a setuid
    /// program, and the kernel detached every perf event).
    pub const PROCESS_LOST: &str = "PROCESS_LOST";
    /// A pending code event was asked of a process without the dynamic
    /// linker's debugger hook (`_dl_debug_state`): nothing would tell the
    /// daemon when its module is loaded.
    pub const NO_LOADER_HOOK: &str = "NO_LOADER_HOOK";
    /// Another tracer traces a thread.
    pub const ALREADY_TRACED: &str = "ALREADY_TRACED";
    /// A per-caller or daemon-wide limit.
    pub const LIMIT_REACHED: &str = "LIMIT_REACHED";
    /// Not enough file descriptors for the fds a request needs (perf
    /// events, breakpoints, uprobes, BPF programs and maps).
    pub const FD_LIMIT: &str = "FD_LIMIT";
    /// The daemon cannot serve the request now (it could not identify the
    /// caller: out of file descriptors); the health service says
    /// NOT_SERVING meanwhile.
    pub const DEGRADED: &str = "DEGRADED";
    /// An unexpected kernel error.
    pub const KERNEL_ERROR: &str = "KERNEL_ERROR";
    /// The lease a request named ended while the request ran (its stream
    /// closed): what the request did was undone (code `ABORTED`: a race,
    /// not a bad argument).
    pub const LEASE_ENDED: &str = "LEASE_ENDED";
    /// The daemon failed in a way no request causes (a task that
    /// panicked, a journal it cannot read).
    pub const INTERNAL: &str = "INTERNAL";
    /// The signal action's signal cannot reach the process: it ignores it,
    /// or one of its threads blocks it.
    pub const SIGNAL_UNUSABLE: &str = "SIGNAL_UNUSABLE";
    /// State feedback cannot reach the process's fuzzer: wpd's library is
    /// not preloaded, the process is not under afl-fuzz, or the library
    /// could not make room in the map.
    pub const NO_FEEDBACK_PATH: &str = "NO_FEEDBACK_PATH";
    /// A symbol name that does not parse.
    pub const BAD_SYMBOL: &str = "BAD_SYMBOL";
    /// No module of that name in the process (metadata `loaded`).
    pub const NO_SUCH_MODULE: &str = "NO_SUCH_MODULE";
    /// A code event on a module the process has not loaded yet, asked for
    /// without `CodeEvent.pending` (metadata `loaded`).
    pub const MODULE_NOT_LOADED: &str = "MODULE_NOT_LOADED";
    /// No such name in the process (metadata `closest`: similar names).
    pub const UNKNOWN_SYMBOL: &str = "UNKNOWN_SYMBOL";
    /// A type name (in a cast) that the module's DWARF does not define
    /// (metadata `closest`: similar type names).
    pub const UNKNOWN_TYPE: &str = "UNKNOWN_TYPE";
    /// A variable the compiler left out: its DWARF gives it no place in
    /// memory.
    pub const OPTIMIZED_OUT: &str = "OPTIMIZED_OUT";
    /// An expression that computes a value (`&x`, a cast `(T)x`) where an
    /// object in memory is needed (a watchpoint).
    pub const NOT_AN_OBJECT: &str = "NOT_AN_OBJECT";
    /// Several unrelated variables of the name (metadata `modules`).
    pub const AMBIGUOUS_SYMBOL: &str = "AMBIGUOUS_SYMBOL";
    /// A function named where a variable is needed.
    pub const NOT_A_VARIABLE: &str = "NOT_A_VARIABLE";
    /// A thread-local variable: one address per thread.
    pub const THREAD_LOCAL: &str = "THREAD_LOCAL";
    /// Members or elements asked for where no DWARF describes the type.
    pub const NO_DEBUG_INFO: &str = "NO_DEBUG_INFO";
    /// A member, element or offset that the type does not have.
    pub const BAD_SYMBOL_PATH: &str = "BAD_SYMBOL_PATH";
    /// An object larger than a thread's slots cover (metadata
    /// `slots_needed`).
    pub const OBJECT_TOO_LARGE: &str = "OBJECT_TOO_LARGE";
    /// The process's mappings or files could not be read.
    pub const SYMBOLS_UNREADABLE: &str = "SYMBOLS_UNREADABLE";
    /// A source line where no code is (a comment, a line between
    /// functions or past the file's end) in a file a loaded module's line
    /// table names.
    pub const NO_CODE_AT_LINE: &str = "NO_CODE_AT_LINE";
    /// A code breakpoint's source file that no line table of the modules
    /// the process has loaded names: misspelled, or a source of a library
    /// loaded later, asked for without `CodeEvent.pending` (metadata
    /// `closest`: the files named closest to it).
    pub const SOURCE_NOT_LOADED: &str = "SOURCE_NOT_LOADED";
    /// A module file the answer needs is still loading (its file is slow
    /// to open or read; metadata `module`): the same request may succeed
    /// later.
    pub const MODULE_LOADING: &str = "MODULE_LOADING";
    /// A module file the answer needs was not loaded: the processes of its
    /// owner have as many loads in flight as they may (metadata `module`,
    /// `uid`, `max_loads`).
    pub const TOO_MANY_LOADS: &str = "TOO_MANY_LOADS";
}

/// Connecting to a daemon, for `wpctl`, tests and IDE-side Rust code.
pub mod connect {
    use std::time::Duration;

    use hyper_util::rt::TokioIo;
    use tonic::transport::{Channel, Endpoint, Uri};

    use crate::v1::watchpoints_client::WatchpointsClient;

    /// Where a daemon listens, parsed from `unix:PATH`, a bare path,
    /// `tcp://HOST:PORT` / `http://HOST:PORT`, or `https://HOST:PORT` (TLS).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Target {
        /// A Unix domain socket path.
        Unix(std::path::PathBuf),
        /// A TCP address, as an `http://host:port` URI.
        Tcp(String),
        /// A TCP address with TLS, as an `https://host:port` URI.
        Tls(String),
    }

    /// How to connect beyond the address.
    #[derive(Debug, Clone, Default)]
    pub struct Options {
        /// PEM of the CA that signed the daemon's certificate (`https://`).
        pub tls_ca_pem: Option<Vec<u8>>,
    }

    impl std::str::FromStr for Target {
        type Err = String;
        fn from_str(s: &str) -> Result<Self, String> {
            if let Some(p) = s.strip_prefix("unix:") {
                let p = p.strip_prefix("//").unwrap_or(p);
                if p.is_empty() {
                    return Err("empty unix socket path".into());
                }
                Ok(Target::Unix(p.into()))
            } else if let Some(hp) = s.strip_prefix("https://") {
                if hp.is_empty() || !hp.contains(':') {
                    return Err(format!("https endpoint needs HOST:PORT, got {s:?}"));
                }
                Ok(Target::Tls(format!("https://{hp}")))
            } else if let Some(hp) = s
                .strip_prefix("tcp://")
                .or_else(|| s.strip_prefix("http://"))
            {
                if hp.is_empty() || !hp.contains(':') {
                    return Err(format!("tcp endpoint needs HOST:PORT, got {s:?}"));
                }
                Ok(Target::Tcp(format!("http://{hp}")))
            } else if s.starts_with('/') || s.starts_with('.') {
                Ok(Target::Unix(s.into()))
            } else {
                Err(format!(
                    "endpoint {s:?} is neither unix:PATH, an absolute path, nor tcp://HOST:PORT"
                ))
            }
        }
    }

    /// Opens a channel to the daemon. Fails fast (5 s) when nobody listens.
    pub async fn channel(target: &Target) -> Result<Channel, tonic::transport::Error> {
        channel_with(target, &Options::default()).await
    }

    /// Like [`channel`], with TLS settings.
    pub async fn channel_with(
        target: &Target,
        opts: &Options,
    ) -> Result<Channel, tonic::transport::Error> {
        match target {
            Target::Tls(uri) => {
                let mut tls = tonic::transport::ClientTlsConfig::new();
                if let Some(ca) = &opts.tls_ca_pem {
                    tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
                }
                Endpoint::from_shared(uri.clone())?
                    .tls_config(tls)?
                    .connect_timeout(Duration::from_secs(5))
                    .connect()
                    .await
            }
            Target::Tcp(uri) => {
                Endpoint::from_shared(uri.clone())?
                    .connect_timeout(Duration::from_secs(5))
                    .connect()
                    .await
            }
            Target::Unix(path) => {
                let path = path.clone();
                // The URI is ignored by the connector; it only has to parse.
                Endpoint::from_static("http://wpd.local")
                    .connect_timeout(Duration::from_secs(5))
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let s = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(s))
                        }
                    }))
                    .await
            }
        }
    }

    /// A ready client (messages up to 64 MiB, for listings of many threads).
    pub async fn client(
        target: &Target,
    ) -> Result<WatchpointsClient<Channel>, tonic::transport::Error> {
        client_with(target, &Options::default()).await
    }

    /// Like [`client`], with TLS settings.
    pub async fn client_with(
        target: &Target,
        opts: &Options,
    ) -> Result<WatchpointsClient<Channel>, tonic::transport::Error> {
        Ok(WatchpointsClient::new(channel_with(target, opts).await?)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20))
    }
}

#[cfg(test)]
mod socket_tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn root_uses_the_systems_socket_and_users_their_own() {
        let rt = Some(Path::new("/run/user/1000"));
        assert_eq!(default_socket(0, rt), Path::new(DEFAULT_SOCKET));
        assert_eq!(
            default_socket(1000, rt),
            Path::new("/run/user/1000/wpd/wpd.sock")
        );
        assert_eq!(
            default_socket(1000, None),
            Path::new("/tmp/wpd-1000/wpd.sock")
        );
        // A relative runtime directory is not one (the XDG rule).
        assert_eq!(
            user_socket(1000, Some(Path::new("run"))),
            Path::new("/tmp/wpd-1000/wpd.sock")
        );
    }
}
