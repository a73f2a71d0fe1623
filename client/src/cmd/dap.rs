//! `wpctl dap`: the Debug Adapter Protocol adapter (crate `wpd-dap`), on
//! stdin/stdout or, with `--listen`, on a Unix socket or a loopback TCP
//! port. Its log (sessions, refused connections) goes to stderr; stdout may
//! be the DAP channel.

use crate::DapArgs;
use crate::cmd::Ctx;
use crate::error::Error;

/// Runs the adapter until its session ends (stdio) or forever (`--listen`).
pub async fn run(ctx: &Ctx, args: &DapArgs) -> Result<(), Error> {
    log_to_stderr();
    // A refused address is said before anything else is done.
    let endpoint: Option<wpd_dap::listen::Endpoint> = args
        .listen
        .as_deref()
        .map(str::parse)
        .transpose()
        .map_err(|e| Error::Local(format!("--listen {e}")))?;
    if args.priority == crate::DapPriority::Realtime {
        realtime();
    }
    let daemon = wpd_dap::Daemon {
        client: ctx.connect().await?,
        token: ctx.token.clone(),
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
