//! `wpd`: the hardware-watchpoint daemon. Parses flags, sets up logging,
//! and runs [`wpd::server::run`].

use clap::Parser;
use wpd::server::Listen;

/// Hardware-watchpoint daemon: owns the debug registers of attached
/// processes and serves the wpd.v1 gRPC API.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Where to listen: unix:PATH or tcp://127.0.0.1:PORT (loopback only).
    #[arg(long, env = "WPD_LISTEN", default_value_t = format!("unix:{}", wpd_proto::DEFAULT_SOCKET))]
    listen: String,
    /// Log filter (tracing-subscriber syntax), e.g. info or wpd=debug.
    #[arg(long, env = "WPD_LOG", default_value = "info")]
    log: String,
}

fn main() -> std::process::ExitCode {
    // Before any thread exists: tracer threads learn about ptrace stops
    // through a signalfd, so no thread may take SIGCHLD itself.
    wpd::backend::ptrace::block_sigchld();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("wpd: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(run())
}

async fn run() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&args.log).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let listen: Listen = match args.listen.parse() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("wpd: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match wpd::server::run(listen).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wpd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
