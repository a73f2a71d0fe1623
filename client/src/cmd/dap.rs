//! `wpctl dap`: the Debug Adapter Protocol adapter (crate `wpd-dap`), on
//! stdin/stdout or, with `--listen`, on a TCP port.

use crate::cmd::Ctx;
use crate::error::Error;
use clap::Args;

/// `wpctl dap`.
#[derive(Debug, Args)]
pub struct DapArgs {
    /// Serve DAP on a TCP address (tcp://127.0.0.1:PORT; port 0 picks one and
    /// prints it on stderr), one debug session per connection, instead of
    /// one session on stdin/stdout
    #[arg(long, value_name = "tcp://HOST:PORT")]
    pub listen: Option<String>,
    /// Scheduling of the adapter: realtime (SCHED_FIFO priority 1, where the
    /// caller may: with every thread of a big target stopping at a hit, the
    /// daemon's real-time threads would otherwise keep the adapter off the
    /// CPUs until the stop is done), or normal
    #[arg(long, value_enum, default_value_t = DapPriority::Realtime)]
    pub priority: DapPriority,
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
    if args.priority == DapPriority::Realtime {
        realtime();
    }
    let daemon = wpd_dap::Daemon {
        client: ctx.connect().await?,
        token: ctx.token.as_ref().map(|t| t.expose().to_string()),
        timeout: ctx.timeout,
    };
    match &args.listen {
        Some(addr) => {
            let bare = addr.strip_prefix("tcp://").ok_or_else(|| {
                Error::Local(format!("--listen {addr:?}: expected tcp://HOST:PORT"))
            })?;
            wpd_dap::listen(bare, daemon)
                .await
                .map_err(|e| Error::Local(format!("--listen {addr}: {e}")))
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
