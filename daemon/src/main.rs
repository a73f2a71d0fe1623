//! `wpd`: the hardware-watchpoint daemon. Parses and checks the flags into
//! one [`wpd::startup::Config`] (secrets and certificates read here), sets
//! up the process (signal mask, allocator, panic hook, scheduling, logging)
//! and runs [`wpd::startup::run`].

use clap::Parser;
use wpd::rpc::conn::ConnLimits;
use wpd::rpc::serve::Listen;

/// Hardware-watchpoint daemon: owns the debug registers of attached
/// processes and serves the wpd.v1 gRPC API.
#[derive(Debug, Parser)]
#[command(name = "wpd", version)]
struct Args {
    /// Print the manual page wpd(8) (roff, generated from these options)
    /// and exit: `wpd --man > /usr/local/share/man/man8/wpd.8`.
    #[arg(long)]
    man: bool,
    /// Where to listen: unix:PATH, or tcp://HOST:PORT (a loopback address,
    /// or any with --tls-cert; TCP callers need --token-file). Default: for
    /// root unix:/run/wpd/wpd.sock; for a user unix:$XDG_RUNTIME_DIR/wpd/wpd.sock
    /// (unix:/tmp/wpd-UID/wpd.sock without XDG_RUNTIME_DIR), where wpctl looks
    /// for the user's own daemon.
    #[arg(long, env = "WPD_LISTEN")]
    listen: Option<String>,
    /// Log filter (tracing-subscriber syntax), e.g. info or wpd=debug.
    #[arg(long, env = "WPD_LOG", default_value = "info")]
    log: String,
    /// File holding the token TCP callers must send (`authorization: Bearer
    /// <token>`). Required with --listen tcp://; keep it mode 0600.
    #[arg(long, env = "WPD_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Mode of the Unix socket, octal (default 660). Every call is authorized
    /// against the caller's uid: 666 lets every user watch its own processes.
    #[arg(long, value_parser = parse_mode)]
    socket_mode: Option<u32>,
    /// PEM certificate chain for TLS on TCP (with --tls-key). Required to
    /// listen on a non-loopback address.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Group (numeric gid) owning the Unix socket.
    #[arg(long)]
    socket_gid: Option<u32>,
    /// Watchpoints one caller (uid) may hold.
    #[arg(long, default_value_t = wpd::engine::Limits::default().watchpoints_per_caller)]
    max_watchpoints_per_caller: usize,
    /// Processes attached at once (the last 16, or a quarter of a smaller
    /// limit, only by root).
    #[arg(long, default_value_t = wpd::engine::Limits::default().processes)]
    max_processes: usize,
    /// Processes one caller other than root may have attached at once.
    #[arg(long, default_value_t = wpd::engine::Limits::default().processes_per_caller)]
    max_processes_per_caller: usize,
    /// Kernel memory one caller's code events may take (their uprobes, BPF
    /// programs and sets of live objects, counted at most), in MiB.
    #[arg(long, default_value_t = wpd::engine::Limits::default().code_event_bytes_per_caller >> 20)]
    max_code_event_memory_per_caller: u64,
    /// Event subscribers at once (the last 16 are kept for privileged
    /// callers).
    #[arg(long, default_value_t = wpd::engine::Limits::default().subscribers)]
    max_subscribers: usize,
    /// Event subscribers one unprivileged caller (uid) may have at once.
    #[arg(long, default_value_t = wpd::engine::Limits::default().subscribers_per_caller)]
    max_subscribers_per_caller: usize,
    /// Connections one unprivileged caller (uid; all of TCP together) may
    /// have open.
    #[arg(long, default_value_t = ConnLimits::default().per_caller)]
    max_connections_per_caller: usize,
    /// Connections open at once from unprivileged callers; privileged ones
    /// (CAP_SYS_PTRACE) have 64 more in reserve.
    #[arg(long, default_value_t = ConnLimits::default().total)]
    max_connections: usize,
    /// TCP connections open at once that have not yet sent a request with
    /// the token (each gets 10 s to do so; when they are all taken the
    /// oldest is closed to admit a new one)
    #[arg(long, default_value_t = ConnLimits::default().pending)]
    max_pending_connections: usize,
    /// HTTP/2 streams (requests and event streams) open at once on one
    /// connection.
    #[arg(long, default_value_t = ConnLimits::default().streams)]
    max_streams_per_connection: u32,
    /// Seconds after which a connection with nothing in flight and nothing
    /// received is closed.
    #[arg(long, default_value_t = ConnLimits::default().idle.as_secs())]
    idle_timeout: u64,
    /// File descriptors callers' watchpoints and code events leave free for
    /// connections and the daemon's own files (default: the connection
    /// limits, the module files the symbol layer holds open and loads at
    /// once, plus 64).
    #[arg(long)]
    fd_headroom: Option<u64>,
    /// File listing the ptrace-attached processes, for a restarted daemon to
    /// clean up after a killed one (default: beside the socket,
    /// `<socket>.ptrace-armed`).
    #[arg(long, env = "WPD_STATE_FILE")]
    ptrace_state_file: Option<std::path::PathBuf>,
    /// Scheduling of the daemon's threads: realtime (SCHED_FIFO priority 1,
    /// needs CAP_SYS_NICE; the daemon keeps up with targets that load every
    /// CPU) or normal (only arm passes are raised while they run).
    #[arg(long, value_enum, env = "WPD_PRIORITY", default_value = "realtime")]
    priority: wpd::sched::Priority,
    /// Act as if kernel.yama.ptrace_scope were N, on a kernel without Yama:
    /// the daemon applies Yama's rules to its callers and to its own
    /// memory reads and attaches, so the paths of a machine that enables it
    /// (Ubuntu's default is 1) can be tried here. Default: the kernel's
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=3))]
    yama_ptrace_scope: Option<u32>,
    /// How the ptrace backend stops a thread at a hit: auto (a perf
    /// breakpoint whose BPF program sends a signal the process ignores,
    /// caught by the tracer, where bpf() is allowed and the process has such
    /// a signal free: a killed daemon then leaves nothing behind), or
    /// debug-registers (DR0-DR7 through ptrace, as debuggers do)
    #[arg(long, value_enum, env = "WPD_PTRACE_STOPS", default_value = "auto")]
    ptrace_stops: PtraceStops,
    /// How the perf backend opens breakpoints: auto (per-thread where bpf()
    /// is allowed, else per-cpu), per-thread (one event per armed thread
    /// and slot whatever the number of CPUs, hits written by a BPF program
    /// into one ring buffer; the perf backend does not start without it),
    /// or per-cpu (one event per thread, slot and CPU, hits in per-CPU
    /// rings)
    #[arg(long, value_enum, env = "WPD_PERF_EVENTS", default_value = "auto")]
    perf_events: PerfEvents,
    /// Size of each ring the perf backend reads hits from, in KiB (a power
    /// of two): the per-thread path's one BPF ring (default 16384) or each
    /// CPU's ring on the per-cpu path (default 2048). What a full ring
    /// drops is counted (`wpctl stats`, kernel_lost); a larger ring takes
    /// longer bursts
    #[arg(long, env = "WPD_PERF_RING_KIB", value_name = "KIB", value_parser = parse_ring_kib)]
    perf_ring_kib: Option<u32>,
    /// Directory of separate debug files, searched by build id
    /// (`DIR/.build-id/xx/yyyy.debug`) and by `.gnu_debuglink`; repeat for
    /// several, in order (default: /usr/lib/debug, /lib/debug)
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dirs: Vec<std::path::PathBuf>,
    /// Directory of the daemon's durable state: the journal of every event
    /// (`DIR/journal/`, replayed by `wpctl events --since`) and the
    /// watchpoints and policies set through the API (`DIR/watchpoints.pb`,
    /// set again after a restart). `none` keeps neither. Default:
    /// /var/lib/wpd for root, else $XDG_STATE_HOME/wpd (~/.local/state/wpd)
    #[arg(long, env = "WPD_STATE_DIR", value_name = "DIR")]
    state_dir: Option<std::path::PathBuf>,
    /// The journal keeps at most this many bytes; the oldest segments are
    /// deleted beyond it (and their events counted)
    #[arg(long, default_value_t = 1 << 30, value_name = "BYTES")]
    journal_max_bytes: u64,
    /// A journal segment is closed at this size
    #[arg(long, default_value_t = 64 << 20, value_name = "BYTES")]
    journal_segment_bytes: u64,
    /// A journal segment is closed at this age, in seconds
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    journal_segment_age: u64,
    /// Longest time an event written to the journal waits for fdatasync,
    /// in milliseconds (what a crash of the machine may take; a crash of the
    /// daemon takes nothing written)
    #[arg(long, default_value_t = 100, value_name = "MS")]
    journal_fsync_ms: u64,
    /// Export every journaled event to NATS JetStream at this server URL
    /// (nats://HOST:PORT or tls://HOST:PORT; several comma-separated), at
    /// the journal's pace: a slow or absent server never holds a target up,
    /// the events wait on disk. Needs the state directory. Exported hits
    /// carry the watched memory's values: they leave the host. No
    /// credentials in the URL (see the --export-nats-* options)
    #[arg(long, env = "WPD_EXPORT_NATS", value_name = "URL")]
    export_nats: Option<String>,
    /// File holding the token the NATS server expects (mode 0600)
    #[arg(long, value_name = "FILE")]
    export_nats_token_file: Option<std::path::PathBuf>,
    /// User name for the NATS server (with --export-nats-password-file)
    #[arg(long, value_name = "USER", requires = "export_nats_password_file")]
    export_nats_user: Option<String>,
    /// File holding the NATS user's password (mode 0600)
    #[arg(long, value_name = "FILE", requires = "export_nats_user")]
    export_nats_password_file: Option<std::path::PathBuf>,
    /// NATS credentials file (JWT and NKey seed, as `nsc` makes them)
    #[arg(long, value_name = "FILE")]
    export_nats_creds: Option<std::path::PathBuf>,
    /// PEM file of the CA the NATS server's certificate chains to; the
    /// connection must then be TLS
    #[arg(long, value_name = "FILE")]
    export_nats_tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a NATS server that verifies clients
    /// (with --export-nats-tls-key)
    #[arg(long, value_name = "FILE", requires = "export_nats_tls_key")]
    export_nats_tls_cert: Option<std::path::PathBuf>,
    /// Key of --export-nats-tls-cert (PEM)
    #[arg(long, value_name = "FILE", requires = "export_nats_tls_cert")]
    export_nats_tls_key: Option<std::path::PathBuf>,
    /// Subject prefix of exported events: <PREFIX>.<HOST>.<KIND>
    #[arg(long, default_value = "wpd", value_name = "PREFIX")]
    export_subject: String,
    /// JetStream stream of exported events, created (file storage, subjects
    /// <PREFIX>.>) if missing
    #[arg(long, default_value = "WPD", value_name = "NAME")]
    export_stream: String,
    /// This host's name in exported events (default: the host name)
    #[arg(long, env = "WPD_HOST_NAME", value_name = "NAME")]
    host_name: Option<String>,
    /// Serve Prometheus metrics on http://ADDR/metrics, e.g. 127.0.0.1:9464
    /// (port 0 picks one; the address is logged). Plain HTTP without
    /// authentication: counters only, no thread, instruction or address.
    /// Default: off
    #[arg(long, env = "WPD_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
}

/// How the exporter authenticates, from the flags (secrets read and
/// checked now).
fn export_auth(args: &Args) -> Result<wpd::export::Auth, String> {
    use wpd::export::Auth;
    let given = [
        args.export_nats_token_file.is_some(),
        args.export_nats_user.is_some(),
        args.export_nats_creds.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(
            "give one way to authenticate to NATS: a token file, a user and password file, or \
             a credentials file"
                .into(),
        );
    }
    let secret = |p: &std::path::Path| wpd::secret::read(p).map_err(|e| e.to_string());
    Ok(
        match (
            &args.export_nats_token_file,
            &args.export_nats_user,
            &args.export_nats_password_file,
            &args.export_nats_creds,
        ) {
            (Some(t), ..) => Auth::Token(secret(t)?),
            (_, Some(u), Some(p), _) => Auth::UserPassword(u.clone(), secret(p)?),
            (.., Some(c)) => {
                // The seed in it is a secret too: same rules.
                secret(c)?;
                Auth::CredsFile(c.clone())
            }
            _ => Auth::None,
        },
    )
}

/// The state directory's settings from the flags (None: `--state-dir none`).
fn state_config(args: &Args) -> Option<wpd::startup::StateOptions> {
    let dir = match &args.state_dir {
        Some(d) if d.as_os_str() == "none" => return None,
        Some(d) => d.clone(),
        None => default_state_dir(),
    };
    let mut journal = wpd::journal::Config::new(dir.join("journal"));
    journal.max_bytes = args.journal_max_bytes;
    journal.segment_bytes = args.journal_segment_bytes.max(4096);
    journal.segment_age = std::time::Duration::from_secs(args.journal_segment_age.max(1));
    journal.fsync_interval = std::time::Duration::from_millis(args.journal_fsync_ms);
    let export = args.export_nats.as_ref().map(|url| wpd::export::Config {
        url: url.clone(),
        auth: wpd::export::Auth::None,
        tls: wpd::export::Tls {
            ca: args.export_nats_tls_ca.clone(),
            client: args
                .export_nats_tls_cert
                .clone()
                .zip(args.export_nats_tls_key.clone()),
        },
        prefix: args.export_subject.clone(),
        stream: args.export_stream.clone(),
        host: args.host_name.clone().unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into())
        }),
        dir: std::path::PathBuf::new(),
    });
    Some(wpd::startup::StateOptions {
        dir,
        journal,
        export,
    })
}

/// Where to listen, and for a user's daemon the directory of its default
/// socket (where its ptrace state file goes too, instead of /run/wpd).
fn listen_of(args: &Args) -> Result<(Listen, Option<std::path::PathBuf>), String> {
    if let Some(l) = &args.listen {
        return Ok((l.parse()?, None));
    }
    let euid = nix::unistd::geteuid().as_raw();
    let runtime = std::env::var_os("XDG_RUNTIME_DIR").map(std::path::PathBuf::from);
    let socket = wpd_proto::default_socket(euid, runtime.as_deref());
    let run_dir = (euid != 0)
        .then(|| socket.parent().map(|d| d.to_path_buf()))
        .flatten();
    Ok((Listen::Unix(socket), run_dir))
}

/// /var/lib/wpd for root; an ordinary user's state directory otherwise.
fn default_state_dir() -> std::path::PathBuf {
    if nix::unistd::geteuid().is_root() {
        return "/var/lib/wpd".into();
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".local/state"))
        })
        .unwrap_or_else(|| "/tmp".into());
    base.join("wpd")
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|e| format!("{s:?} is not an octal mode: {e}"))?;
    if m > 0o777 {
        return Err(format!("mode {s} is larger than 777"));
    }
    Ok(m)
}

/// `--perf-events`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PerfEvents {
    /// Per-thread where possible.
    Auto,
    /// Per-thread or nothing.
    PerThread,
    /// Per-CPU always.
    PerCpu,
}

/// `--ptrace-stops`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PtraceStops {
    /// Signal stops where possible.
    Auto,
    /// Debug registers always.
    DebugRegisters,
}

/// A ring size in KiB: a power of two from 4 KiB (a page) to 1 GiB.
fn parse_ring_kib(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|e| format!("{e}"))?;
    if n.is_power_of_two() && (4..=1 << 20).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n}: a power of two from 4 to 1048576"))
    }
}

/// The daemon's configuration from the flags, or the one line saying what
/// is wrong with them.
fn config(args: &Args) -> Result<wpd::startup::Config, String> {
    let (listen, run_dir) = listen_of(args)?;
    let state_file = args.ptrace_state_file.clone().or_else(|| {
        run_dir
            .as_ref()
            .map(|d| wpd::startup::state_file_in(&listen, d))
    });
    let mut state = state_config(args);
    if args.export_nats.is_some() && state.is_none() {
        return Err(
            "--export-nats exports the journal: it needs a state directory, not --state-dir none"
                .into(),
        );
    }
    if let Some(export) = state.as_mut().and_then(|s| s.export.as_mut()) {
        wpd::export::check_url(&export.url)?;
        export.auth = export_auth(args).map_err(|e| format!("--export-nats: {e}"))?;
    }
    let token = match &args.token_file {
        Some(p) => Some(
            wpd::secret::read(p)
                .map_err(|e| format!("token file: {e}"))?
                .expose()
                .to_string(),
        ),
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match (std::fs::read(c), std::fs::read(k)) {
            (Ok(c), Ok(k)) => Some((c, k)),
            (Err(e), _) | (_, Err(e)) => {
                return Err(format!("cannot read the TLS certificate or key: {e}"));
            }
        },
        _ => None,
    };
    let conns = ConnLimits {
        per_caller: args.max_connections_per_caller,
        total: args.max_connections,
        privileged_reserve: ConnLimits::default().privileged_reserve,
        idle: std::time::Duration::from_secs(args.idle_timeout.max(1)),
        streams: args.max_streams_per_connection.max(1),
        pending: args.max_pending_connections.max(1),
    };
    let fd_headroom = args
        .fd_headroom
        .unwrap_or((conns.total + conns.privileged_reserve + wpd::symbols::FILES_HELD) as u64 + 64);
    Ok(wpd::startup::Config {
        listen,
        server: wpd::rpc::serve::Options {
            token,
            socket_mode: args.socket_mode,
            socket_gid: args.socket_gid,
            tls,
            conns,
            metrics_listen: args.metrics_listen,
        },
        limits: wpd::engine::Limits {
            watchpoints_per_caller: args.max_watchpoints_per_caller,
            processes: args.max_processes,
            processes_per_caller: args.max_processes_per_caller,
            code_event_bytes_per_caller: args.max_code_event_memory_per_caller << 20,
            subscribers: args.max_subscribers,
            subscribers_per_caller: args.max_subscribers_per_caller,
            fd_headroom,
        },
        state_file,
        private_run_dir: run_dir,
        perf_events: match args.perf_events {
            PerfEvents::Auto => wpd::backend::perf::EventsPolicy::Auto,
            PerfEvents::PerThread => wpd::backend::perf::EventsPolicy::PerThread,
            PerfEvents::PerCpu => wpd::backend::perf::EventsPolicy::PerCpu,
        },
        perf_ring_kib: args.perf_ring_kib,
        ptrace_stops: match args.ptrace_stops {
            PtraceStops::Auto => wpd::backend::ptrace::signal_bp::Policy::Auto,
            PtraceStops::DebugRegisters => wpd::backend::ptrace::signal_bp::Policy::DebugRegisters,
        },
        ptrace_shards: env_number("WPD_PTRACE_SHARDS"),
        debug_dirs: args.debug_dirs.clone(),
        exec_search_path: std::env::var_os("PATH")
            .map(|p| {
                std::env::split_paths(&p)
                    .filter(|d| d.is_absolute())
                    .collect()
            })
            .unwrap_or_else(|| {
                ["/usr/local/bin", "/usr/bin", "/bin"]
                    .map(std::path::PathBuf::from)
                    .to_vec()
            }),
        state,
        faults: wpd::startup::Faults {
            after_check: env_number("WPD_FAULT_AFTER_CHECK_MS")
                .map(std::time::Duration::from_millis),
            journal_write_delay: env_number("WPD_FAULT_JOURNAL_DELAY_MS")
                .map(std::time::Duration::from_millis),
            panic_at_hit: env_number("WPD_FAULT_PANIC_AT_HIT"),
        },
    })
}

/// A number from the environment (tuning and the tests' fault injection).
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// Prints wpd(8) to stdout.
fn print_manual() -> std::process::ExitCode {
    use clap::CommandFactory;
    use std::io::Write;
    let mut page = Vec::new();
    let man = clap_mangen::Man::new(Args::command()).section("8");
    match man.render(&mut page) {
        Ok(()) if std::io::stdout().write_all(&page).is_ok() => std::process::ExitCode::SUCCESS,
        Ok(()) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("wpd: rendering the manual page: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn main() -> std::process::ExitCode {
    // Before any thread exists: SIGCHLD (ptrace stops) may be taken only by
    // a tracer thread waiting in `ppoll`, which unblocks it there.
    wpd::backend::ptrace::block_sigchld();
    // One allocator arena for every thread: glibc otherwise gives busy
    // threads (tracers, blocking-pool threads) arenas of their own, which
    // `malloc_trim` cannot empty. Measured (`wpd-bench --only memory`): after
    // a 10,000-thread process exits, RSS stayed +2.4 MiB above the baseline
    // and +6.4 MiB after a second one; +0.7 and +1.2 MiB with one arena.
    // The daemon's threads allocate little on their hot paths.
    #[cfg(target_env = "gnu")]
    // SAFETY: sets an allocator tunable before any thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    let args = Args::parse();
    if args.man {
        return print_manual();
    }
    if let Some(scope) = args.yama_ptrace_scope {
        if std::path::Path::new("/proc/sys/kernel/yama/ptrace_scope").exists() {
            eprintln!("wpd: --yama-ptrace-scope is for kernels without Yama; this one has it");
            return std::process::ExitCode::from(2);
        }
        wpd::procfs::yama::assume_scope(scope);
    }
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("wpd: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // A panic ends the daemon at once (exiting closes every perf fd and
    // detaches every tracee, kernel-facts §2b); a tracer thread first
    // catches it and detaches its own tracees, registers cleared
    // (`backend/ptrace/shards.rs`).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        if !wpd::backend::ptrace::is_tracer_thread() {
            std::process::abort();
        }
    }));
    // Before any thread exists too: every thread inherits it.
    wpd::sched::apply(args.priority);
    // Requests run their syscalls on the blocking pool. Bounded: hundreds of
    // concurrent clients queue instead of each getting a thread (a thread
    // costs a stack and an allocator arena that outlive the burst).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(32)
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wpd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_new(&args.log).unwrap_or_else(|_| "info".into()),
            )
            .with_writer(std::io::stderr)
            .init();
        match wpd::startup::run(config).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("wpd: {e:#}");
                std::process::ExitCode::FAILURE
            }
        }
    })
}
