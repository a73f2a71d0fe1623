//! `wpctl dap`: the Debug Adapter Protocol adapter (crate `wpd-dap`), on
//! stdin/stdout or, with `--listen`, on a Unix socket or a loopback TCP
//! port. Its log (sessions, refused connections) goes to stderr; stdout may
//! be the DAP channel.

use crate::cmd::Ctx;
use crate::error::Error;
use clap::Args;

/// `wpctl dap`.
#[derive(Debug, Args)]
pub struct DapArgs {
    /// Serve DAP on a Unix socket (unix:PATH, made mode 0600) or a loopback
    /// TCP address (tcp://127.0.0.1:PORT or tcp://[::1]:PORT; port 0 picks one
    /// and prints it on stderr), one debug session per connection, instead of
    /// one session on stdin/stdout. Only connections of the adapter's own
    /// user are served (a session acts with the adapter's rights); other
    /// addresses are refused: there is no TLS for DAP (reach the adapter
    /// from another host through an SSH-forwarded Unix socket)
    #[arg(long, value_name = "unix:PATH|tcp://127.0.0.1:PORT")]
    pub listen: Option<String>,
    /// With --listen: sessions served at once; further connections are
    /// refused with an error response and a log line
    #[arg(long, default_value_t = wpd_dap::listen::DEFAULT_MAX_SESSIONS as u32,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_sessions: u32,
    /// Scheduling of the adapter: realtime (SCHED_FIFO priority 1, where the
    /// caller may: with every thread of a big target stopping at a hit, the
    /// daemon's real-time threads would otherwise keep the adapter off the
    /// CPUs until the stop is done), or normal
    #[arg(long, value_enum, default_value_t = DapPriority::Realtime)]
    pub priority: DapPriority,
    /// What a `launch` runs in the IDE's terminal (`runInTerminal`): start
    /// the program after `--` held before its first instruction and report
    /// its pid and exit code to the session at this socket
    #[arg(long, value_name = "SOCKET", hide = true, requires = "program")]
    pub launch_helper: Option<std::path::PathBuf>,
    /// The program and its arguments (with --launch-helper)
    #[arg(last = true, hide = true)]
    pub program: Vec<String>,
}

/// `wpctl dap --priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DapPriority {
    /// SCHED_FIFO priority 1 when allowed, else normal.
    Realtime,
    /// The default scheduling.
    Normal,
}

/// Runs the adapter until its session ends (stdio) or forever (`--listen`).
pub async fn run(ctx: &Ctx, args: &DapArgs) -> Result<(), Error> {
    if let (Some(socket), Some((program, rest))) = (&args.launch_helper, args.program.split_first())
    {
        // In the IDE's terminal: the program's parent, nothing else.
        let p = wpd_dap::launch::Program {
            program: program.clone(),
            args: rest.to_vec(),
            ..Default::default()
        };
        std::process::exit(wpd_dap::launch::terminal_helper(socket, p));
    }
    log_to_stderr();
    // A refused address is said before anything else is done.
    let endpoint: Option<wpd_dap::listen::Endpoint> = args
        .listen
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e| Error::Local(format!("--listen {e}")))?;
    if args.priority == DapPriority::Realtime {
        realtime();
    }
    let daemon = wpd_dap::Daemon {
        client: ctx.connect().await?,
        token: ctx.token.as_ref().map(|t| t.expose().to_string()),
        timeout: ctx.timeout,
    };
    match endpoint {
        Some(endpoint) => {
            let opts = wpd_dap::listen::Options {
                max_sessions: args.max_sessions as usize,
            };
            // Ended by SIGINT or SIGTERM: the Unix socket file goes with it.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .map_err(|e| Error::Local(format!("SIGTERM handler: {e}")))?;
            tokio::select! {
                r = wpd_dap::listen::serve(&endpoint, daemon, opts) => {
                    r.map_err(|e| Error::Local(format!("--listen {e}")))
                }
                _ = tokio::signal::ctrl_c() => Ok(()),
                _ = term.recv() => Ok(()),
            }
        }
        None => wpd_dap::run(tokio::io::stdin(), tokio::io::stdout(), daemon)
            .await
            .map_err(|e| Error::Local(format!("debug session: {e}"))),
    }
}

/// SCHED_FIFO priority 1 for the adapter's thread, and the threads it
/// starts after (stdin/stdout readers), when the caller may (root,
/// CAP_SYS_NICE or an RLIMIT_RTPRIO); otherwise nothing changes.
fn realtime() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: changes only the calling thread's scheduling policy.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
}

/// The adapter's log lines on stderr (`WPCTL_LOG` filters, `info` by
/// default), without colours: IDEs keep an adapter's stderr as text.
fn log_to_stderr() {
    let filter = std::env::var("WPCTL_LOG")
        .ok()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
